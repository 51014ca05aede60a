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
    argv = ["data", "preprocess", "--input", src, "--output-prefix", out, "--append-eod", "--no-progress"]
    assert main(argv) == 0
    assert "2 documents, 10 tokens, uint16" in capsys.readouterr().out
    out += "_text_document"  # NeoX's name
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
    ds = MMapIndexedDataset(out + "_body_document")
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
    assert list(tmp_path.glob("o*")) == []  # nothing half-written is left behind


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


@pytest.mark.slow
def test_neox_arguments_several_inputs_keys_and_compression(tmp_path, capsys):
    import gzip

    from tests.data.gpt2_files import reference_encode, write_gpt2_files

    vocab, merges = write_gpt2_files(tmp_path / "tok")
    records_a = [{"text": "the hello", "title": "one"}, {"text": "world", "title": "two"}]
    records_b = [{"text": "the weather", "title": ""}]
    a = jsonl(tmp_path, records_a, "a.jsonl")
    b = tmp_path / "b.jsonl.gz"
    with gzip.open(b, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records_b))
    out = str(tmp_path / "data" / "mix")
    # NeoX's tools/preprocess_data.py spelling, with the command renamed
    argv = f"data preprocess --input {a},{b} --jsonl-keys text title --output-prefix {out} "
    argv += f"--tokenizer-type GPT2BPETokenizer --vocab-file {vocab} --merge-file {merges} --append-eod "
    argv += "--workers 1 --no-progress"
    assert main(argv.split()) == 0
    assert "mix_text_document.bin/.idx: 3 documents" in capsys.readouterr().out
    eod = 256 + 12  # the fixture's 256 byte tokens and 12 merges come first
    text = MMapIndexedDataset(out + "_text_document")
    texts = [r["text"] for r in records_a + records_b]
    assert [list(text[i]) for i in range(3)] == [reference_encode(t) + [eod] for t in texts]
    title = MMapIndexedDataset(out + "_title_document")
    assert len(title) == 2  # the empty title is no document, as in NeoX
    # Parallel workers write the same bytes.
    single = {
        p: (tmp_path / "data" / p).read_bytes() for p in ("mix_text_document.bin", "mix_text_document.idx")
    }
    argv = argv.replace("--workers 1", "--workers 2")
    assert main(argv.split()) == 0
    for name, content in single.items():
        assert (tmp_path / "data" / name).read_bytes() == content


def test_zst_input_needs_zstandard(tmp_path, capsys):
    path = tmp_path / "in.jsonl.zst"
    try:
        import zstandard
    except ImportError:
        path.write_bytes(b"\x28\xb5\x2f\xfd")  # a zstd frame header
        argv = ["data", "preprocess", "--input", str(path), "--output-prefix", str(tmp_path / "o")]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "zstandard" in err and "pip install zstandard" in err and "Traceback" not in err
        return
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "ab"}\n'))
    argv = [
        "data",
        "preprocess",
        "--input",
        str(path),
        "--output-prefix",
        str(tmp_path / "o"),
        "--append-eod",
    ]
    assert main(argv) == 0
    assert list(MMapIndexedDataset(str(tmp_path / "o_text_document"))[0]) == [97, 98, 256]
