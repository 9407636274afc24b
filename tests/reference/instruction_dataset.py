#!/usr/bin/env python3
"""fsdp_qlora's InstructionDataset.__getitem__ and collate_fn, transcribed without torch.

Usage: instruction_dataset.py TOKENIZER DATA_FILE STYLE N [CONTEXT_LENGTH]
  TOKENIZER: a sentencepiece tokenizer.model (Llama-2) or a tokenizer.json (Llama-3);
  STYLE: alpaca | qna | qna_no_ctx | guanaco;  N: how many records from the start of DATA_FILE
  (JSON Lines or a JSON array);  CONTEXT_LENGTH: collate_fn's truncation (default: none).
Writes one JSON line {"input_ids": [...], "labels": [...]} per record, each as collate_fn makes a
batch of that one record. The tokenizer is what AutoTokenizer gives fsdp_qlora: for Llama-2
Hugging Face's LlamaTokenizer (legacy), encode(text) = [BOS] + sentencepiece ids; for a
tokenizer.json, its encode(text) with the special tokens of its post-processor (Llama-3:
<|begin_of_text|> first) and eos_token from the tokenizer_config.json beside it; pad = eos.

Llama-2 needs the Python sentencepiece module (Debian: apt-get install python3-sentencepiece, then
run with /usr/bin/python3): tests/unit/data_reference_test.cpp runs this script. A tokenizer.json
needs Hugging Face's `tokenizers` (pip), which CI does not have: `--digests` writes, per record,
the id count and FNV-1a digests of input_ids and labels (as tests/token_digest.h computes them),
and tests/data/llama3_instruction_digests.txt holds its output for the first 200 records of the
shared sql and alpaca files at context 256, each after a "# FILE STYLE N CONTEXT" line:
  for f in "sql.jsonl qna" "alpaca.jsonl alpaca"; do set -- $f; echo "# $1 $2 200 256"
    python instruction_dataset.py ../shared/data/llama3/tokenizer.json ../shared/data/$1 $2 200 256 --digests
  done > tests/data/llama3_instruction_digests.txt
"""
import copy
import json
import sys

IGNORE_INDEX = -100

PROMPT_DICT = {
    "prompt_input": (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
    ),
    "prompt_no_input": (
        "Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:"
    ),
}


class LlamaTokenizerLegacy:
    """What fsdp_qlora's tokenizer.encode does for Llama-2: BOS + sentencepiece ids."""

    def __init__(self, model_file):
        import sentencepiece

        self.sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
        self.bos_token_id = self.sp.bos_id()
        self.eos_token_id = self.sp.eos_id()
        self.pad_token_id = self.eos_token_id  # fsdp_qlora: tokenizer.pad_token_id = eos

    def encode(self, text):
        return [self.bos_token_id] + self.sp.encode(text)


class HfTokenizerJson:
    """What AutoTokenizer.encode does with a tokenizer.json: the post-processor's special tokens
    included; bos / eos named by the tokenizer_config.json beside it."""

    def __init__(self, path):
        import os
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(path)
        with open(os.path.join(os.path.dirname(path), "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        name = lambda token: token["content"] if isinstance(token, dict) else token
        self.eos_token_id = self.tokenizer.token_to_id(name(config["eos_token"]))
        self.pad_token_id = self.eos_token_id

    def encode(self, text):
        return self.tokenizer.encode(text).ids


def load_tokenizer(path):
    return HfTokenizerJson(path) if path.endswith(".json") else LlamaTokenizerLegacy(path)


def fnv_digest(ids):
    """tests/token_digest.h's digest_of_ids of one list: each id as 4 little-endian bytes, then 0xFFFFFFFF."""
    h = 0xCBF29CE484222325
    for value in list(ids) + [-1]:
        for byte in (value & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class InstructionDataset:
    def __init__(self, dataset, tokenizer, style="alpaca"):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.style = style

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if self.style == "guanaco":
            prompt = self.dataset[index]["text"].split("### Assistant: ")[0]
            example = self.dataset[index]["text"]
        elif self.style == "qna":
            prompt_template = "###Context:\n{context}\n###Question:\n{question}\n###Answer:\n"
            sample = self.dataset[index]
            prompt = prompt_template.format_map(sample)
            example = prompt + sample["answer"]
        elif self.style == "qna_no_ctx":
            prompt_template = "###Question:\n{question}\n###Answer:\n"
            sample = self.dataset[index]
            prompt = prompt_template.format_map(sample)
            example = prompt + sample["answer"]
        else:  # Alpaca
            ann = self.dataset[index]
            if ann.get("input", "") == "":
                prompt = PROMPT_DICT["prompt_no_input"].format_map(ann)
            else:
                prompt = PROMPT_DICT["prompt_input"].format_map(ann)
            example = prompt + ann["output"]

        prompt = self.tokenizer.encode(prompt)
        example = self.tokenizer.encode(example)
        example.append(self.tokenizer.eos_token_id)
        labels = copy.deepcopy(example)
        labels[: len(prompt)] = [-1] * min(len(prompt), len(labels))
        example_mask = [t >= 0 for t in example]
        label_mask = [t >= 0 for t in labels]
        example = [t if m else 0 for t, m in zip(example, example_mask)]
        labels = [t if m else IGNORE_INDEX for t, m in zip(labels, label_mask)]
        return {"input_ids": example, "labels": labels}


def collate_fn(batch, tokenizer, context_length):
    """pad_sequence(batch_first=True) with pad / -100, then [:, :context_length]."""
    longest = max(len(item["input_ids"]) for item in batch)
    input_ids = [item["input_ids"] + [tokenizer.pad_token_id] * (longest - len(item["input_ids"]))
                 for item in batch]
    labels = [item["labels"] + [IGNORE_INDEX] * (longest - len(item["labels"])) for item in batch]
    if context_length is not None:
        input_ids = [row[:context_length] for row in input_ids]
        labels = [row[:context_length] for row in labels]
    return {"input_ids": input_ids, "labels": labels}


def read_records(path, n):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        records = json.loads(text)
    else:
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return records[:n]


def main(argv):
    digests = "--digests" in argv
    argv = [a for a in argv if a != "--digests"]
    if len(argv) not in (5, 6):
        sys.exit(__doc__)
    tokenizer = load_tokenizer(argv[1])
    dataset = InstructionDataset(read_records(argv[2], int(argv[4])), tokenizer, style=argv[3])
    context_length = int(argv[5]) if len(argv) == 6 else None
    out = sys.stdout
    for i in range(len(dataset)):
        batch = collate_fn([dataset[i]], tokenizer, context_length)
        ids, labels = batch["input_ids"][0], batch["labels"][0]
        if digests:
            out.write(f"{len(ids)} {fnv_digest(ids):016x} {fnv_digest(labels):016x}\n")
        else:
            out.write(json.dumps({"input_ids": ids, "labels": labels}))
            out.write("\n")


if __name__ == "__main__":
    main(sys.argv)
