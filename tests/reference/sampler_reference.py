#!/usr/bin/env python3
"""Prints real PyTorch values for fsdpq's sampler (src/data/sampler.h) as JSON.

Needs torch (CPU is enough). For each case it prints
  torch.randperm(n, generator=torch.Generator().manual_seed(seed))
and the indices torch.utils.data.DistributedSampler(drop_last=False) gives one rank in one
epoch, so the C++ known-answer tests in tests/unit/data_sampler_test.cpp can be checked
against them:  python3 tests/reference/sampler_reference.py > sampler_reference.json
"""
import json
import sys

import torch
from torch.utils.data import DistributedSampler

RANDPERM_CASES = [  # (n, seed)
    (1, 0), (2, 0), (5, 0), (10, 0), (10, 42), (16, 1), (100, 42), (1000, 7),
    (10, 2**32 + 3),  # only the low 32 bits of the seed reach the engine
]

SAMPLER_CASES = [  # (n, seed, world, rank, epoch)
    (10, 42, 1, 0, 0), (10, 42, 2, 0, 0), (10, 42, 2, 1, 0), (10, 42, 2, 1, 1),
    (11, 42, 4, 3, 0), (3, 0, 8, 7, 0), (128, 42, 4, 2, 5), (0, 1, 2, 0, 0),
]


class _Sized(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def main():
    out = {"torch_version": torch.__version__, "randperm": [], "sampler": []}
    for n, seed in RANDPERM_CASES:
        g = torch.Generator().manual_seed(seed)
        out["randperm"].append(
            {"n": n, "seed": seed, "perm": torch.randperm(n, generator=g).tolist()})
    for n, seed, world, rank, epoch in SAMPLER_CASES:
        sampler = DistributedSampler(_Sized(n), num_replicas=world, rank=rank, seed=seed)
        sampler.set_epoch(epoch)
        out["sampler"].append({"n": n, "seed": seed, "world": world, "rank": rank,
                               "epoch": epoch, "indices": list(iter(sampler)),
                               "num_samples": len(sampler)})
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
