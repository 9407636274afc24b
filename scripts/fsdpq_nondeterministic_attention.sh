#!/usr/bin/env bash
# build/fsdpq with cuDNN's non-deterministic attention backward (FSDPQ_ATTENTION, opt-in; the PyTorch
# peers' SDPA backward is non-deterministic too): a binary for bench.py's --fsdpq and for the
# @PATH lines of scripts/device_checkpointing_settings.sh.
FSDPQ_ATTENTION=cudnn-nondeterministic exec "$(dirname "$0")/../build/fsdpq" "$@"
