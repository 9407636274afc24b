"""What the reference scripts (hqq_reference.py, nf4_reference.py) share: splitmix64's finaliser for
their synthetic weights, and the checksum they record for each array, which
tests/unit/reference_checksum.h computes the same way on fsdpq's bytes."""
import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x):
    """SplitMix64's finaliser on a uint64 array (numpy wraps on overflow, as C++ does)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def checksum(data: bytes) -> str:
    """sum_j mix64(word_j + j * golden) mod 2^64 over little-endian 8-byte words (zero padded)."""
    padded = data + b"\0" * (-len(data) % 8)
    words = np.frombuffer(padded, dtype="<u8")
    with np.errstate(over="ignore"):
        mixed = mix64(words + np.arange(len(words), dtype=np.uint64) * GOLDEN)
        total = int(np.sum(mixed, dtype=np.uint64))
    return f"{total:016x}"


def as_bytes(t) -> bytes:
    """A torch tensor's bytes in memory order (16-bit floats as their bit patterns)."""
    import torch  # only the scripts that hold tensors need it

    t = t.detach().contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()
