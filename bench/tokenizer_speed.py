#!/usr/bin/env python3
"""Llama-3 tokenizer speed on one thread: fsdpq against Hugging Face tokenizers (Rust), side by side.

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers tiktoken
    /tmp/tokvenv/bin/python bench/tokenizer_speed.py [--fsdpq build/fsdpq] [--shared ../shared/data]

Every record of alpaca.jsonl is formatted as training formats it (fsdp_qlora's Alpaca template,
prompt + output) and encoded without special tokens by:
  - fsdpq: `fsdpq tokenize --jsonl FILE --time` (OMP_NUM_THREADS=1), which times encode() alone,
    with tokenizer.json and with the tiktoken tokenizer.model;
  - Hugging Face tokenizers on tokenizer.json: encode() per record, and encode_batch() with
    RAYON_NUM_THREADS=1 (one thread);
  - tiktoken on tokenizer.model, for reference, when it is installed (encode_ordinary is
    single-threaded).
Each is timed --repeat times and the best run is kept; the ids of every record must agree, or the
script stops. Prints a Markdown table: seconds, records/s, tokens/s, MB/s.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPACA_WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
                     "further context. Write a response that appropriately completes the request.\n\n"
                     "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately "
                   "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def alpaca_texts(path):
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            texts.append((ALPACA_WITH_INPUT if r.get("input") else ALPACA_NO_INPUT).format(**r) + r["output"])
    return texts


def best_of(repeat, run):
    """(seconds, ids) of the fastest of `repeat` runs of run() -> (seconds, ids)."""
    runs = [run() for _ in range(repeat)]
    return min(runs, key=lambda r: r[0])


def time_fsdpq(binary, tokenizer, jsonl):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([binary, "tokenize", "--tokenizer", tokenizer, "--jsonl", jsonl, "--time"],
                         capture_output=True, text=True, env=env, check=True)
    # "tokenize: loaded in L s; encoded N texts (B bytes, T tokens) in S s"
    seconds = float(out.stderr.strip().rsplit(" in ", 1)[1].split()[0])
    return seconds, [json.loads(line)["ids"] for line in out.stdout.splitlines()]


def timed(encode):
    start = time.perf_counter()
    ids = encode()
    return time.perf_counter() - start, ids


def tiktoken_encoding(model_file):
    import tiktoken
    with open(model_file, "rb") as f:
        ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in f if line.strip())}
    return tiktoken.Encoding(name="llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens={})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsdpq", default=os.path.join(REPO, "build", "fsdpq"))
    parser.add_argument("--shared", default=os.path.join(REPO, "..", "shared", "data"))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    llama3 = os.path.join(args.shared, "llama3")
    texts = alpaca_texts(os.path.join(args.shared, "alpaca.jsonl"))
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = os.path.join(tmp, "alpaca_texts.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
        for name in ("tokenizer.json", "tokenizer.model"):
            tok_path = os.path.join(llama3, name)
            rows.append((f"fsdpq, {name}", best_of(args.repeat, lambda: time_fsdpq(args.fsdpq, tok_path, jsonl))))

    hf = Tokenizer.from_file(os.path.join(llama3, "tokenizer.json"))
    rows.append(("HF tokenizers encode(), tokenizer.json", best_of(
        args.repeat, lambda: timed(lambda: [hf.encode(t, add_special_tokens=False).ids for t in texts]))))
    rows.append(("HF tokenizers encode_batch(), 1 thread", best_of(
        args.repeat, lambda: timed(lambda: [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]))))
    try:
        tt = tiktoken_encoding(os.path.join(llama3, "tokenizer.model"))
        rows.append(("tiktoken encode_ordinary(), tokenizer.model", best_of(
            args.repeat, lambda: timed(lambda: [tt.encode_ordinary(t) for t in texts]))))
    except ImportError:
        print("tiktoken is not installed: its row is left out", file=sys.stderr)

    reference = rows[2][1][1]
    for name, (_, ids) in rows:
        if ids != reference:
            first = next(i for i, (a, b) in enumerate(zip(ids, reference)) if a != b)
            sys.exit(f"{name}: the ids of record {first} differ from Hugging Face's")
    tokens = sum(len(ids) for ids in reference)
    print(f"alpaca.jsonl: {len(texts)} records, {total_bytes / 1e6:.2f} MB, {tokens} tokens; "
          f"best of {args.repeat}; ids equal everywhere\n")
    print("| encoder | seconds | records/s | tokens/s | MB/s |")
    print("|---|---|---|---|---|")
    for name, (seconds, _) in rows:
        print(f"| {name} | {seconds:.3f} | {len(texts) / seconds:,.0f} | {tokens / seconds:,.0f} | "
              f"{total_bytes / 1e6 / seconds:.1f} |")


if __name__ == "__main__":
    main()
