#!/usr/bin/env python3
"""fsdp_qlora's InstructionDataset.__getitem__ and collate_fn, transcribed without torch.

Usage: instruction_dataset.py TOKENIZER_MODEL DATA_FILE STYLE N [CONTEXT_LENGTH]
  STYLE: alpaca | qna | qna_no_ctx | guanaco;  N: how many records from the start of DATA_FILE
  (JSON Lines or a JSON array);  CONTEXT_LENGTH: collate_fn's truncation (default: none).
Writes one JSON line {"input_ids": [...], "labels": [...]} per record, each as collate_fn makes a
batch of that one record. The tokenizer is Hugging Face's LlamaTokenizer (legacy) as fsdp_qlora
loads it for Llama-2: encode(text) = [BOS] + sentencepiece ids; pad = eos.

Needs the Python sentencepiece module (Debian: apt-get install python3-sentencepiece, then run
with /usr/bin/python3). tests/unit/data_reference_test.cpp compares fsdpq against this script.
"""
import copy
import json
import sys

import sentencepiece

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
        self.sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
        self.bos_token_id = self.sp.bos_id()
        self.eos_token_id = self.sp.eos_id()
        self.pad_token_id = self.eos_token_id  # fsdp_qlora: tokenizer.pad_token_id = eos

    def encode(self, text):
        return [self.bos_token_id] + self.sp.encode(text)


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
    if len(argv) not in (5, 6):
        sys.exit(__doc__)
    tokenizer = LlamaTokenizerLegacy(argv[1])
    dataset = InstructionDataset(read_records(argv[2], int(argv[4])), tokenizer, style=argv[3])
    context_length = int(argv[5]) if len(argv) == 6 else None
    out = sys.stdout
    for i in range(len(dataset)):
        batch = collate_fn([dataset[i]], tokenizer, context_length)
        out.write(json.dumps({"input_ids": batch["input_ids"][0], "labels": batch["labels"][0]}))
        out.write("\n")


if __name__ == "__main__":
    main(sys.argv)
