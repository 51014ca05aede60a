"""``zerotopo data preprocess``: jsonl to indexed dataset, and its error messages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zerotopo.cli.main import main
from zerotopo.data.indexed import MMapIndexedDataset


def jsonl(tmp_path, records, name="in.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_preprocess_byte(tmp_path, capsys):
    src = jsonl(tmp_path, [{"text": "héllo", "id": 1}, {"text": ""}, "", {"text": "ab"}])
    out = str(tmp_path / "out" / "corpus")
    assert main(["data", "preprocess", "--input", src, "--output-prefix", out, "--no-progress"]) == 0
    assert "2 documents, 10 tokens, uint16" in capsys.readouterr().out
    ds = MMapIndexedDataset(out)
    assert ds.dtype == np.uint16 and len(ds) == 2
    assert list(ds[0]) == list("héllo".encode()) + [256] and list(ds[1]) == [97, 98, 256]
    assert main(["data", "info", out]) == 0
    assert "2 documents" in capsys.readouterr().out


def test_preprocess_hf_without_eod_custom_key(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "<|endoftext|>": 1, "a": 2, "b": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    src = jsonl(tmp_path, [{"body": "a b a"}, {"body": "b"}])
    out = str(tmp_path / "hf")
    argv = [
        "data",
        "preprocess",
        "--input",
        src,
        "--json-key",
        "body",
        "--output-prefix",
        out,
        "--no-progress",
        "--tokenizer-type",
        "HFTokenizer",
        "--vocab-file",
        str(tmp_path / "tok.json"),
        "--no-append-eod",
    ]
    assert main(argv) == 0
    ds = MMapIndexedDataset(out)
    assert [list(ds[i]) for i in range(2)] == [[2, 3, 2], [3]]


@pytest.mark.parametrize(
    "records, fragment",
    [
        ([{"text": "ok"}, "{broken"], "in.jsonl:2: not valid JSON"),
        ([{"text": "ok"}, {"txt": "x"}], "in.jsonl:2: no 'text' field (found: txt)"),
        ([{"text": 5}], "in.jsonl:1: field 'text' is int"),
        ([{"text": ""}], "no non-empty"),
    ],
)
def test_preprocess_errors(tmp_path, capsys, records, fragment):
    src = jsonl(tmp_path, records)
    assert (
        main(["data", "preprocess", "--input", src, "--output-prefix", str(tmp_path / "o"), "--no-progress"])
        == 2
    )
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert not (tmp_path / "o.idx").exists()


def test_preprocess_missing_input(tmp_path, capsys):
    argv = [
        "data",
        "preprocess",
        "--input",
        str(tmp_path / "none.jsonl"),
        "--output-prefix",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 2
    assert "does not exist" in capsys.readouterr().err
    assert (
        main(
            ["data", "preprocess", "--input", "x", "--output-prefix", "y", "--tokenizer-type", "HFTokenizer"]
        )
        == 2
    )
    assert "vocab_file" in capsys.readouterr().err
