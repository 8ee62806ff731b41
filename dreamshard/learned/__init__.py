"""Learned planners' machinery: DreamShard's nets (`nets`), its estimated MDP (`mdp`) and its
training loop (`dreamshard`), and what every learned planner's loop reuses (`loop`). The planners
themselves are registry files in dreamshard/planners/ behind the `LearnedPlanner` role."""
