"""peer_examples.py: the peer's batches from fsdpq's exported examples (pytest bench/test_peer_examples.py;
no torch needed)."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_examples  # noqa: E402
from peer_examples import IGNORE_INDEX, ExamplesFileError, check_vocab, example_batches, read_examples  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def example(n, prompt, start=10):
    """n ids start, start+1, ...; the first `prompt` labels masked as fsdpq masks the prompt."""
    ids = list(range(start, start + n))
    return ids, [IGNORE_INDEX] * prompt + ids[prompt:]


def write(tmp_path, lines, name="examples.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def as_line(ids, labels):
    return json.dumps({"input_ids": ids, "labels": labels})


def test_reads_the_file_in_order_skipping_blank_lines(tmp_path):
    a, b = example(3, 1), example(5, 2, start=100)
    path = write(tmp_path, [as_line(*a), "", as_line(*b)])
    assert read_examples(path) == [a, b]


def test_each_batch_is_padded_to_its_longest_example():
    batch = example_batches([example(3, 1), example(5, 2, start=100)], batch_size=2, count=1, context_length=512)[0]
    assert batch.input_ids == [[10, 11, 12, 0, 0], [100, 101, 102, 103, 104]]
    assert batch.labels == [[IGNORE_INDEX, 11, 12, IGNORE_INDEX, IGNORE_INDEX],
                            [IGNORE_INDEX, IGNORE_INDEX, 102, 103, 104]]
    assert (batch.seq_len, batch.tokens, batch.real_tokens) == (5, 10, 8)


def test_pad_id_is_a_parameter():
    batch = peer_examples.collate([example(1, 1), example(2, 1)], context_length=8, pad_id=2)
    assert batch.input_ids == [[10, 2], [10, 11]]


def test_examples_longer_than_the_context_are_cut():
    batch = example_batches([example(7, 2), example(2, 1)], batch_size=2, count=1, context_length=4)[0]
    assert batch.input_ids == [[10, 11, 12, 13], [10, 11, 0, 0]]
    assert batch.labels == [[IGNORE_INDEX, IGNORE_INDEX, 12, 13], [IGNORE_INDEX, 11, IGNORE_INDEX, IGNORE_INDEX]]
    assert (batch.tokens, batch.real_tokens) == (8, 6)


def test_batches_take_consecutive_examples_and_cycle():
    examples = [example(n, 1, start=10 * n) for n in (1, 2, 3, 4, 5)]
    batches = example_batches(examples, batch_size=2, count=4, context_length=512)
    firsts = [[row[0] for row in b.input_ids] for b in batches]
    # examples 0,1 | 2,3 | 4,0 | 1,2: file order, back to the start when the steps need more
    assert firsts == [[10, 20], [30, 40], [50, 10], [20, 30]]
    assert [b.seq_len for b in batches] == [2, 4, 5, 3]
    assert [b.real_tokens for b in batches] == [3, 7, 6, 5]
    assert [b.tokens for b in batches] == [4, 8, 10, 6]


def test_a_batch_larger_than_the_file_repeats_examples():
    batch = example_batches([example(2, 1)], batch_size=3, count=1, context_length=512)[0]
    assert batch.input_ids == [[10, 11]] * 3 and batch.real_tokens == 6


def test_bad_batch_settings_are_refused():
    with pytest.raises(ValueError, match="batch_size 0"):
        example_batches([example(2, 1)], batch_size=0, count=1, context_length=8)


@pytest.mark.parametrize("line, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", 'expected an object with "input_ids" and "labels"'),
    ('{"input_ids": [1, 2]}', 'expected an object with "input_ids" and "labels"'),
    ('{"input_ids": [1, "2"], "labels": [1, 2]}', '"input_ids" must be a list of integers'),
    ('{"input_ids": [1, 2], "labels": [1, true]}', '"labels" must be a list of integers'),
    ('{"input_ids": [1, 2], "labels": [1]}', "2 input_ids but 1 labels"),
    ('{"input_ids": [], "labels": []}', '"input_ids" is empty'),
    ('{"input_ids": [1, -3], "labels": [1, 2]}', "negative token id -3"),
])
def test_a_bad_line_is_named_with_its_file_and_number(tmp_path, line, message):
    path = write(tmp_path, [as_line(*example(2, 1)), line])
    with pytest.raises(ExamplesFileError) as e:
        read_examples(path)
    assert str(e.value).startswith(f"{path}:2: ")
    assert message in str(e.value)


def test_a_missing_or_empty_file_is_named(tmp_path):
    with pytest.raises(ExamplesFileError, match="cannot read"):
        read_examples(str(tmp_path / "missing.jsonl"))
    empty = write(tmp_path, ["", "  "], name="empty.jsonl")
    with pytest.raises(ExamplesFileError, match=f"^{empty}: no examples"):
        read_examples(empty)


def test_ids_outside_the_vocabulary_are_refused():
    check_vocab([example(3, 1)], vocab_size=13, path="f.jsonl")
    with pytest.raises(ExamplesFileError, match="f.jsonl: token id 12 is outside the model's vocabulary of 12"):
        check_vocab([example(3, 1)], vocab_size=12, path="f.jsonl")


def test_peer_train_reports_a_bad_file_as_an_error_line(tmp_path):
    """Checked before torch is imported: the JSON line names the file and line, exit 1."""
    path = write(tmp_path, [as_line(*example(2, 1)), '{"input_ids": [1], "labels": []}'])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "peer_train.py"), "--peer", "hf_lora_eager",
                           "--shape", "tiny", "--examples", path], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    rec = json.loads(proc.stdout)
    assert rec["error"] == f"{path}:2: 1 input_ids but 0 labels; expected one label per id"
