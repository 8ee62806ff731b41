"""A small DLRM built the TorchRec way, placed by dreamshard, sharded and trained by TorchRec.

    .venv/bin/python examples/torchrec_dlrm.py

Plans its 4 embedding tables on 2 ranks with dreamshard (`size_lookup --split`: no GPU, no model
file), prints the plan in TorchRec's terms, then starts 2 CPU processes (gloo) that shard the model
with DistributedModelParallel from that plan and train a few steps. On GPUs: device_type="cuda",
the "nccl" backend and torch.device("cuda", rank) are the only changes.
"""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from dreamshard.planners import get_planner
from dreamshard.torchrec_io import quiet, task_from_torchrec, to_sharding_plan

WORLD, BATCH, STEPS = 2, 256, 8  # ranks, global batch, training steps
TABLES = {"user": (20_000, 64, 6.0), "item": (5_000, 32, 2.0), "city": (800, 16, 1.0), "device": (50, 8, 1.0)}  # rows, dim, mean lookups


class DLRM(torch.nn.Module):
    def __init__(self, device: torch.device):
        super().__init__()
        self.ebc = EmbeddingBagCollection(device=device, tables=[
            EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[name]) for name, (rows, dim, _) in TABLES.items()])
        self.dense = torch.nn.Linear(13, 16)
        self.top = torch.nn.Sequential(torch.nn.Linear(16 + sum(d for _, d, _ in TABLES.values()), 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, features: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        return self.top(torch.cat([self.dense(dense), self.ebc(features).values()], dim=1)).squeeze(1)


def batch(step: int, size: int, seed: int = 0):
    """A batch of `size` samples: skewed ids per table (a few hot rows), dense features, and labels
    the model can learn (the sign of the first dense feature)."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    lengths = [torch.poisson(torch.full((size,), pf), generator=g).long() for _, _, pf in TABLES.values()]
    ids = [(torch.rand(int(n.sum()), generator=g) ** 3 * rows).long() for (rows, _, _), n in zip(TABLES.values(), lengths)]
    features = KeyedJaggedTensor(keys=list(TABLES), values=torch.cat(ids), lengths=torch.cat(lengths))
    dense = torch.randn(size, 13, generator=g)
    return features, dense, (dense[:, 0] > 0).float()


def train(rank: int, port: int, plan) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    model = DLRM(torch.device("meta"))  # DMP materialises only this rank's shards
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": 0.5})  # fused into the embedding backward
    with quiet():  # TorchRec's warnings about CPU and DDP
        model = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
                                         plan=to_sharding_plan(plan, module=model, device_type="cpu"), sharders=[EmbeddingBagCollectionSharder()])
    dense_opt = torch.optim.SGD([p for n, p in model.named_parameters() if ".ebc." not in n], lr=0.5)
    for step in range(STEPS):
        features, dense, labels = batch(step, BATCH // WORLD, seed=rank + 1)  # each rank reads its own part of the batch
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(features, dense), labels)
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        dist.all_reduce(loss := loss.detach())
        if rank == 0:
            print(f"step {step} loss {loss.item() / WORLD:.4f}", flush=True)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


def main() -> None:
    # 1. dreamshard plans the model's tables, their pooling and reuse measured on sample batches
    model = DLRM(torch.device("meta"))
    task = task_from_torchrec(model, devices=WORLD, max_memory_bytes=8 * 2**20, batch_size=BATCH, batches=[batch(s, BATCH, seed=99)[0] for s in range(4)])
    plan = get_planner("size_lookup", split=True).plan(task)
    print(f"dreamshard {plan.planner} plan: tables split {plan.split_tables()}, bytes per rank {plan.device_bytes()}")
    # 2. the plan in TorchRec's terms (DistributedModelParallel's `plan=`)
    print(to_sharding_plan(plan, module=model, device_type="cpu"))
    # 3. TorchRec shards the model from it and trains, one process per rank
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(train, args=(port, plan), nprocs=WORLD, start_method="spawn")


if __name__ == "__main__":
    main()
