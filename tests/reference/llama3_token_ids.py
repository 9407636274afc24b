#!/usr/bin/env python3
"""Expected token ids for fsdpq's byte-level BPE tokenizer tests (tests/unit/data_bpe_*_test.cpp),
made with the reference implementations, so the C++ tests need no Python.

Rerun (from the repository root; ../shared/data must hold llama3/, alpaca.jsonl and sql.jsonl):

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3 tiktoken==0.14.0
    /tmp/tokvenv/bin/python tests/reference/llama3_token_ids.py [--shared ../shared/data] [--retrain]

Reads tests/data/tokenizer_corpus.json (hand-written texts: many scripts, emoji and ZWJ sequences,
whitespace runs, CRLF, tabs, digits, code, contractions, special-token strings in text) and writes:

  tests/data/llama3_corpus_ids.json     every corpus text's full ids, encoded by Hugging Face
      tokenizers on llama3/tokenizer.json (encode(text, add_special_tokens=False)) and by tiktoken
      on llama3/tokenizer.model (Meta's pattern and 256 special tokens, allowed_special="all").
  tests/data/llama3_shared_digests.txt  for each record of alpaca.jsonl and sql.jsonl, a digest of
      the ids of its texts (each field value in file order, then the fsdp_qlora-formatted example):
      the id count and a 64-bit FNV-1a of the ids (see digest()), per file format.
  tests/data/tiny_bpe/tokenizer.json    a small byte-level BPE trained here on the corpus (kept
      unless --retrain): the base of the variants below.
  tests/data/tiny_bpe_variants.json     variants of it (JSON merge patches, RFC 7386: other
      pre-tokenizers, Split behaviours, added-token flags, unk and byte fallback), each with the
      digest of every corpus text's ids from Hugging Face tokenizers.
"""
import argparse
import base64
import json
import os
import sys

import tiktoken
import tokenizers
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors, trainers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "tests", "data")

# Meta's llama-models llama3/tokenizer.py (the wheel tokenizer.model comes from).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_NAMED_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
    "<|image|>",
]

# fsdp_qlora's prompt templates (InstructionDataset): the formatted example of a record.
ALPACA_WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
                     "further context. Write a response that appropriately completes the request.\n\n"
                     "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:")
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately "
                   "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:")
SQL_EXAMPLE = "###Context:\n{context}\n###Question:\n{question}\n###Answer:\n"


def digest(id_lists):
    """(count, FNV-1a 64) over the ids of several texts: each id as 4 little-endian bytes, and
    0xFFFFFFFF after each text, so where one text ends is part of the digest."""
    h = 0xCBF29CE484222325
    count = 0
    for ids in id_lists:
        for value in list(ids) + [0xFFFFFFFF]:
            for byte in int(value).to_bytes(4, "little"):
                h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        count += len(ids)
    return count, h


def record_texts(record, source):
    """The texts of one record that the tests encode: its values, then the formatted example."""
    texts = list(record.values())
    if source == "alpaca":
        template = ALPACA_WITH_INPUT if record.get("input", "") else ALPACA_NO_INPUT
        texts.append(template.format(**record) + record["output"])
    else:
        texts.append(SQL_EXAMPLE.format(**record) + record["answer"])
    return texts


def llama3_tiktoken(model_file):
    with open(model_file, "rb") as f:
        ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in f if line.strip())}
    specials = LLAMA3_NAMED_SPECIALS + [f"<|reserved_special_token_{2 + i}|>"
                                        for i in range(256 - len(LLAMA3_NAMED_SPECIALS))]
    return tiktoken.Encoding(name="llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                             special_tokens={t: len(ranks) + i for i, t in enumerate(specials)})


def write_corpus_ids(corpus, hf, tt):
    out = {"tokenizer.json": [hf.encode(t, add_special_tokens=False).ids for t in corpus],
           "tokenizer.model": [tt.encode(t, allowed_special="all") for t in corpus]}
    with open(os.path.join(DATA, "llama3_corpus_ids.json"), "w") as f:
        f.write("{\n")
        for n, (key, lists) in enumerate(out.items()):
            f.write(f' "{key}": [\n')
            f.write(",\n".join("  " + json.dumps(ids, separators=(",", ":")) for ids in lists))
            f.write("\n ]" + (",\n" if n + 1 < len(out) else "\n"))
        f.write("}\n")
    differ = sum(a != b for a, b in zip(*out.values()))
    print(f"corpus: {len(corpus)} texts; tokenizer.json and tokenizer.model differ on {differ}")


def write_shared_digests(shared, hf, tt):
    lines = ["# Per record: the id count and FNV-1a 64 of its texts' ids (tests/reference/llama3_token_ids.py),",
             "# from tokenizer.json (Hugging Face tokenizers " + tokenizers.__version__ + "); a second pair",
             "# follows where tokenizer.model (tiktoken " + tiktoken.__version__ + ") gives other ids."]
    for source in ("alpaca", "sql"):
        with open(os.path.join(shared, source + ".jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        lines.append(f"{source}.jsonl {len(records)}")
        differ = 0
        for record in records:
            texts = record_texts(record, source)
            hf_count, hf_hash = digest(e.ids for e in hf.encode_batch(texts, add_special_tokens=False))
            tt_count, tt_hash = digest(tt.encode(t, allowed_special="all") for t in texts)
            line = f"{hf_count} {hf_hash:016x}"
            if (tt_count, tt_hash) != (hf_count, hf_hash):
                line += f" {tt_count} {tt_hash:016x}"
                differ += 1
            lines.append(line)
        print(f"{source}: {len(records)} records; the two formats differ on {differ}")
    with open(os.path.join(DATA, "llama3_shared_digests.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def train_tiny_bpe(corpus, path):
    """A 600-token byte-level BPE learned from the corpus's ASCII texts. Its alphabet is only the
    bytes those hold (no initial_alphabet), so no byte above 0x7F has a token: the unk and
    byte-fallback variants need that. Merges are written in the older "a b" form, after a
    #version line."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, show_progress=False,
                                  special_tokens=["<s>", "</s>"])
    tok.train_from_iterator([t for t in corpus if t.isascii()] * 3, trainer=trainer)
    spec = json.loads(tok.to_str())
    spec["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                       {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}
    spec["model"]["merges"] = ["#version: 0.2"] + [" ".join(m) for m in spec["model"]["merges"]]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False, indent=1)
        f.write("\n")


def added(content, id, **flags):
    token = {"id": id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
    token.update(flags)
    return token


def variants(base):
    """(name, merge patch) pairs: each changes one thing of the base tokenizer."""
    vocab = base["model"]["vocab"]
    n = len(vocab)
    split = lambda regex, behavior, invert=False, string=False: {
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {("String" if string else "Regex"): regex}, "behavior": behavior,
             "invert": invert},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    fallback_tokens = {f"<0x{b:02X}>": n + 1 + b for b in range(256)}
    specials = [added("<s>", 0, special=True), added("</s>", 1, special=True)]
    return [
        ("gpt2_byte_level", {}),
        ("add_prefix_space", {"pre_tokenizer": {"add_prefix_space": True}}),
        ("ignore_merges", {"model": {"ignore_merges": True}}),
        ("llama3_split_isolated", {"pre_tokenizer": split(LLAMA3_PATTERN, "Isolated")}),
        ("split_string_removed", {"pre_tokenizer": split(" ", "Removed", string=True)}),
        ("split_merged_with_previous", {"pre_tokenizer": split(r"\s+", "MergedWithPrevious")}),
        ("split_merged_with_next_empty_matches", {"pre_tokenizer": split(r"(?=\p{Lu})", "MergedWithNext")}),
        ("split_isolated_empty_matches", {"pre_tokenizer": split(r"(?=\p{Lu})|(?<=\d)", "Isolated")}),
        ("split_contiguous_inverted", {"pre_tokenizer": split(r"\p{L}+", "Contiguous", invert=True)}),
        ("split_removed_inverted", {"pre_tokenizer": split(r"\p{L}+|\p{N}", "Removed", invert=True)}),
        ("split_then_prefixed_byte_level", {"pre_tokenizer": {
            "type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"[,.!?]"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}}),
        ("added_tokens_flags", {"added_tokens": specials + [
            added("<|eot_id|>", n, special=True),
            added("<|eot_id|> more", n + 1),            # longest match wins over <|eot_id|>
            added("dog", n + 2, single_word=True),       # only where no word character touches it
            added("<|end_header_id|>", n + 3, rstrip=True, special=True),
            added("<|start_header_id|>", n + 4, lstrip=True, special=True),
            added(" spaced ", n + 5, lstrip=True, rstrip=True),
            added("text", n + 6, normalized=True),       # second pass, in what the first left
            added("ext<|eot", n + 7),                    # first pass: takes 'ext<|eot' before <|eot_id|>
            added("Hello", vocab.get("Hello", n + 8)),    # a vocab token as an added token
        ]}),
        ("unk_token", {"model": {"unk_token": "<unk>", "vocab": {"<unk>": n}}}),
        ("unk_token_fused", {"model": {"unk_token": "<unk>", "fuse_unk": True, "vocab": {"<unk>": n}}}),
        ("byte_fallback", {"model": {"byte_fallback": True, "unk_token": "<unk>",
                                     "vocab": dict({"<unk>": n}, **fallback_tokens)}}),
    ]


def write_variants(corpus):
    base_path = os.path.join(DATA, "tiny_bpe", "tokenizer.json")
    with open(base_path, encoding="utf-8") as f:
        base = json.load(f)
    out = []
    for name, patch in variants(base):
        spec = merge_patch(json.loads(json.dumps(base)), patch)
        tok = Tokenizer.from_str(json.dumps(spec))
        encodings = [tok.encode(t, add_special_tokens=False).ids for t in corpus]
        digests = [digest([ids]) for ids in encodings]
        out.append({"name": name, "patch": patch, "digests": [f"{c} {h:016x}" for c, h in digests]})
    with open(os.path.join(DATA, "tiny_bpe_variants.json"), "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(v, ensure_ascii=False) for v in out))
        f.write("\n]\n")
    print(f"tiny_bpe: {len(out)} variants")


def merge_patch(target, patch):
    """RFC 7386, as nlohmann::json::merge_patch applies it in the C++ test."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=os.path.join(REPO, "..", "shared", "data"))
    parser.add_argument("--retrain", action="store_true", help="train tests/data/tiny_bpe/tokenizer.json again")
    args = parser.parse_args()
    with open(os.path.join(DATA, "tokenizer_corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    hf = Tokenizer.from_file(os.path.join(args.shared, "llama3", "tokenizer.json"))
    tt = llama3_tiktoken(os.path.join(args.shared, "llama3", "tokenizer.model"))
    write_corpus_ids(corpus, hf, tt)
    write_shared_digests(args.shared, hf, tt)
    tiny = os.path.join(DATA, "tiny_bpe", "tokenizer.json")
    if args.retrain or not os.path.exists(tiny):
        train_tiny_bpe(corpus, tiny)
    write_variants(corpus)


if __name__ == "__main__":
    sys.exit(main())
