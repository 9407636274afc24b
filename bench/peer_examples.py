"""The peer's batches from fsdpq's exported training examples (`fsdpq examples CONFIG.ini --out FILE`),
batched as fsdp_qlora's DataLoader does at world size 1. Pure Python, no torch (test_peer_examples.py).

A batch is the next --batch-size examples of the file, in file order (the file is already in fsdpq's
epoch-1 sampler order), cycling to the start when the steps need more. fsdp_qlora's collate_fn pads
each batch to its longest example (pad_sequence: input ids with the pad id, labels with -100) and
then cuts it to context_length; cutting each example first gives the same rows.
"""
import json
from dataclasses import dataclass, field

IGNORE_INDEX = -100  # labels the loss skips (torch's cross-entropy ignore_index)


class ExamplesFileError(ValueError):
    """A bad examples file; the message names the file and, for a bad line, its number."""


@dataclass
class Batch:
    input_ids: list = field(default_factory=list)  # [rows][seq_len]
    labels: list = field(default_factory=list)  # [rows][seq_len]
    real_tokens: int = 0  # the examples' own tokens (the rest is padding)

    @property
    def seq_len(self):
        return len(self.input_ids[0]) if self.input_ids else 0

    @property
    def tokens(self):
        """Slots computed, padding included (what fsdp_qlora counts as tokens)."""
        return len(self.input_ids) * self.seq_len


def parse_example(line, where):
    """One {"input_ids": [...], "labels": [...]} line as (input_ids, labels); `where` is "FILE:LINE"."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise ExamplesFileError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict) or "input_ids" not in record or "labels" not in record:
        raise ExamplesFileError(f'{where}: expected an object with "input_ids" and "labels" '
                                "(the lines `fsdpq examples --out FILE` writes)")
    ids, labels = record["input_ids"], record["labels"]
    for name, values in (("input_ids", ids), ("labels", labels)):
        if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ExamplesFileError(f'{where}: "{name}" must be a list of integers')
    if not ids:
        raise ExamplesFileError(f'{where}: "input_ids" is empty')
    if len(labels) != len(ids):
        raise ExamplesFileError(f'{where}: {len(ids)} input_ids but {len(labels)} labels; expected one label per id')
    if min(ids) < 0:
        raise ExamplesFileError(f"{where}: negative token id {min(ids)}")
    return ids, labels


def read_examples(path):
    """Every example of the file, in order; blank lines are skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise ExamplesFileError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ExamplesFileError(f"{path}: not UTF-8 text; expected JSON lines from `fsdpq examples`") from None
    examples = [parse_example(line, f"{path}:{number}") for number, line in enumerate(lines, 1) if line.strip()]
    if not examples:
        raise ExamplesFileError(f"{path}: no examples; expected one {{\"input_ids\": [...], \"labels\": [...]}} line "
                                "per example (fsdpq examples CONFIG.ini --out FILE writes them)")
    return examples


def check_vocab(examples, vocab_size, path):
    """Refuses ids the model's embedding has no row for (a file made with another tokenizer)."""
    top = max(max(ids) for ids, _ in examples)
    if top >= vocab_size:
        raise ExamplesFileError(f"{path}: token id {top} is outside the model's vocabulary of {vocab_size}; "
                                "export the examples with the model's tokenizer")


def collate(examples, context_length, pad_id=0):
    """fsdp_qlora's collate_fn: each example cut to context_length, rows padded to the longest."""
    rows = [(ids[:context_length], labels[:context_length]) for ids, labels in examples]
    width = max(len(ids) for ids, _ in rows)
    batch = Batch()
    for ids, labels in rows:
        pad = width - len(ids)
        batch.input_ids.append(list(ids) + [pad_id] * pad)
        batch.labels.append(list(labels) + [IGNORE_INDEX] * pad)
        batch.real_tokens += len(ids)
    return batch


def example_batches(examples, batch_size, count, context_length, pad_id=0):
    """`count` batches of `batch_size` consecutive examples, cycling through the file."""
    if batch_size < 1 or context_length < 1:
        raise ValueError(f"batch_size {batch_size} and context_length {context_length} must be at least 1")
    n = len(examples)
    return [collate([examples[(b * batch_size + k) % n] for k in range(batch_size)], context_length, pad_id)
            for b in range(count)]
