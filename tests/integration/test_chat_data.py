"""Fine-tuning data as users have it: chat rows rendered with a chat template and completion-only labels,
prompt/completion rows, packing with masked labels, eval splits, Hugging Face datasets read offline, the
tokenized-data cache, and bad rows refused in one line before anything is recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.data import chat, prepare
from runner.data.blocks import to_blocks
from runner.data.cache import cache_key, cache_path
from runner.data.check import check_data
from runner.data.rows import DataError, read_rows
from runner.spec import builtin
from runner.spec.recipe import Recipe, parse_recipe
from tests.support import ROOT, Ftui, run_in_process

TWO_TURNS = {"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Capital of Peru?"},
    {"role": "assistant", "content": "Lima."},
    {"role": "user", "content": "And Chile?"},
    {"role": "assistant", "content": "Santiago."},
]}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(builtin.ensure_tokenizer(tmp_path_factory.mktemp("cache"))))
    chat.ensure_chat_template(tok, builtin=True)
    return tok


def _recipe(source: Path | str, **data: Any) -> Recipe:
    fields = "".join(f"{k} = {json.dumps(v)}\n" for k, v in data.items())
    return parse_recipe(f"[data]\nsource = {json.dumps(str(source))}\n{fields}")


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_two_turn_conversation_labels_token_by_token(tokenizer: Any) -> None:
    data = _recipe("x.jsonl", train_on="completions", context_length=256).data
    encoded = chat.encode([TWO_TURNS], "chat", data, tokenizer)
    ids, labels = encoded.ids[0], encoded.labels[0]
    text = chat.render(tokenizer, TWO_TURNS["messages"])
    assert text == ("<|system|>\nBe brief.<|endoftext|><|user|>\nCapital of Peru?<|endoftext|>"
                    "<|assistant|>\nLima.<|endoftext|><|user|>\nAnd Chile?<|endoftext|>"
                    "<|assistant|>\nSantiago.<|endoftext|>")
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    # Token by token: which are learned. Learned tokens are exactly the assistant contents and their
    # end-of-text; the headers, the system and the user turns are -100.
    pieces = [(tokenizer.decode([t]), lab != chat.IGNORE) for t, lab in zip(ids, labels, strict=True)]
    learned = "".join(p for p, keep in pieces if keep)
    masked = "".join(p for p, keep in pieces if not keep)
    assert learned == "Lima.<|endoftext|>Santiago.<|endoftext|>"
    assert masked == ("<|system|>\nBe brief.<|endoftext|><|user|>\nCapital of Peru?<|endoftext|><|assistant|>\n"
                      "<|user|>\nAnd Chile?<|endoftext|><|assistant|>\n")
    for (piece, keep), label, tok in zip(pieces, labels, ids, strict=True):
        assert label == (tok if keep else -100), piece
    # The runs of learned tokens are exactly two (one per assistant turn), each ending in end-of-text.
    runs = [i for i in range(len(labels)) if labels[i] != -100 and (i == 0 or labels[i - 1] == -100)]
    assert len(runs) == 2 and labels[-1] == tokenizer.eos_token_id
    everything = chat.encode([TWO_TURNS], "chat", _recipe("x.jsonl", train_on="all").data, tokenizer)
    assert everything.labels[0] == ids


def test_prompt_completion_rows_mask_the_prompt(tokenizer: Any) -> None:
    data = _recipe("x.jsonl", train_on="completions", prompt_field="q", completion_field="a").data
    encoded = chat.encode([{"q": "2 plus 2 is", "a": " 4"}], "completion", data, tokenizer)
    ids, labels = encoded.ids[0], encoded.labels[0]
    prompt = tokenizer("2 plus 2 is", add_special_tokens=False)["input_ids"]
    assert ids[: len(prompt)] == prompt and ids[-1] == tokenizer.eos_token_id
    assert labels[: len(prompt)] == [-100] * len(prompt)
    assert labels[len(prompt):] == ids[len(prompt):]


def test_packing_keeps_masked_labels_aligned_and_drops_blocks_with_nothing_to_learn(tokenizer: Any) -> None:
    data = _recipe("x.jsonl", train_on="completions", context_length=16, pack=True).data
    encoded = chat.encode([TWO_TURNS] * 3, "chat", data.model_copy(update={"context_length": 256}), tokenizer)
    blocks = to_blocks(encoded, "chat", data, tokenizer, for_eval=False)
    assert blocks.labels is not None and blocks.attention_mask is None
    stream = [t for ids in encoded.ids for t in ids]
    labels = [t for lab in encoded.labels for t in lab]
    kept = 0
    for start in range(0, len(stream) - 15, 16):
        block_labels = labels[start : start + 16]
        if all(label == -100 for label in block_labels[1:]):
            continue  # nothing to learn: dropped (its loss would be 0/0)
        assert blocks.input_ids[kept].tolist() == stream[start : start + 16]
        assert blocks.labels[kept].tolist() == block_labels
        kept += 1
    assert kept == blocks.input_ids.shape[0] and kept < len(stream) // 16
    evaluation = to_blocks(encoded, "chat", data, tokenizer, for_eval=True)
    assert evaluation.attention_mask is not None, "the eval set's last partial block is padded, not dropped"
    assert int(evaluation.attention_mask.sum()) == len(stream)


def test_eval_fraction_and_eval_source(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(20)]
    source = _write(tmp_path / "chat.jsonl", rows)
    train, held, _, _ = prepare.split_rows(_recipe(source, eval_fraction=0.25).data, seed=3)
    assert held is not None and len(held) == 5 and len(train) == 15
    assert sorted(json.dumps(r) for r in train + held) == sorted(json.dumps(r) for r in rows)
    assert prepare.split_rows(_recipe(source, eval_fraction=0.25).data, seed=3)[1] == held, "seeded"
    with pytest.raises(DataError, match=r"data.eval_fraction: 0.01 of 20 rows of chat.jsonl is an empty eval split"):
        prepare.split_rows(_recipe(source, eval_fraction=0.01).data, seed=0)
    empty = tmp_path / "empty-eval.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match=r"data.eval_source: empty-eval.jsonl: the eval split has no rows"):
        prepare.split_rows(_recipe(source, eval_source=str(empty)).data, seed=0)


def test_bad_rows_are_named(tmp_path: Path, tokenizer: Any) -> None:
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    cases = [
        ({"text": "no messages"}, "chat.jsonl row 2: has no field 'messages' (fields: text)"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "chat.jsonl row 2: message 1: unknown role 'bot'"),
        ({"messages": [{"role": "user", "content": "only a question"}]},
         "chat.jsonl row 2: has no assistant message to learn from"),
        ({"messages": [{"role": "user", "content": "x " * 300}, {"role": "assistant", "content": "y"}]},
         "chat.jsonl row 2: conversation of"),
    ]
    for bad, expected in cases:
        path = _write(tmp_path / "chat.jsonl", [good, bad])
        data = _recipe(path, format="chat", train_on="completions", context_length=64).data
        with pytest.raises(DataError) as err:
            check_data(data)
            prepare.load_data(data, tokenizer, 0, use_cache=False)
        assert str(err.value).startswith("data.source: ") and expected in str(err.value), str(err.value)


def test_cache_key_and_hit(tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTUI_HOME", str(tmp_path / "home"))
    path = _write(tmp_path / "chat.jsonl", [TWO_TURNS] * 8)
    data = _recipe(path, train_on="completions", context_length=96, eval_fraction=0.25).data
    first = prepare.load_data(data, tokenizer, 0)
    second = prepare.load_data(data, tokenizer, 0)
    assert (first.cached, second.cached) == (False, True)
    assert cache_path(first.key).is_file() and first.key == second.key
    assert second.train.input_ids.equal(first.train.input_ids)
    assert second.train.labels is not None and first.train.labels is not None
    assert second.train.labels.equal(first.train.labels)
    assert second.eval is not None and first.eval is not None and second.eval.input_ids.equal(first.eval.input_ids)
    keys = {first.key}
    for change in ({"train_on": "all"}, {"context_length": 32}, {"pack": False}):
        keys.add(cache_key(data.model_copy(update=change), tokenizer, 0))
    keys.add(cache_key(data, tokenizer, 1))  # the eval split depends on the seed
    _write(path, [TWO_TURNS] * 9)
    keys.add(cache_key(data, tokenizer, 0))  # the source's content
    assert len(keys) == 6
    assert cache_key(data.model_copy(update={"shuffle": False}), tokenizer, 0) in keys, "order is not tokenizing"


def test_hugging_face_datasets_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(6)]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(rows[:2])}).save_to_disk(str(saved))
    data = _recipe(saved, split="test").data
    assert read_rows(str(saved), data, "test")[0] == rows[:2]
    check_data(data)
    with pytest.raises(DataError, match=r"^data.split: .*saved has no split 'validation' \(splits: test, train\)$"):
        check_data(_recipe(saved, split="validation").data)
    folder = tmp_path / "local"
    (folder / "data").mkdir(parents=True)
    _write(folder / "data" / "train.jsonl", rows)
    assert read_rows(str(folder), _recipe(folder).data, "train")[0] == rows
    # A script-free hub dataset in the local Hugging Face cache, by id, with no network.
    repo = tmp_path / "hf" / "hub" / "datasets--acme--qa"
    snapshot = repo / "snapshots" / ("0" * 40)
    (snapshot / "data").mkdir(parents=True)
    _write(snapshot / "data" / "train.jsonl", rows[:3])
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    recipe = _recipe("acme/qa")
    assert recipe.data.source == "acme/qa", "a hub id is not made a path"
    assert read_rows("acme/qa", recipe.data, "train")[0] == rows[:3]
    with pytest.raises(DataError, match=r"^data.source: dataset 'acme/missing' not found locally"):
        check_data(_recipe("acme/missing").data)


def test_a_bad_row_deep_in_the_file_is_refused_before_anything_is_recorded(
        ftui: Ftui, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``main`` in this process, on the session's home (the refusal comes before any launch)."""
    rows = [TWO_TURNS] * 40 + [{"messages": [{"role": "narrator", "content": "x"}]}]
    path = _write(tmp_path / "chat.jsonl", rows)
    before = len(ftui.runs())
    monkeypatch.setenv("FTUI_HOME", str(ftui.home))
    monkeypatch.setenv("FTUI_DB", ftui.db)
    monkeypatch.chdir(ROOT)
    proc = run_in_process(capsys, "run", str(ROOT / "recipes" / "chat-lora.toml"), "--set",
                          f"data.source={json.dumps(str(path))}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftui: ") and lines[0].endswith(
        "data.source: chat.jsonl row 41: message 1: unknown role 'narrator' (roles: system, user, assistant, tool)")
    assert "Traceback" not in proc.stderr
    assert len(ftui.runs()) == before, "nothing recorded"
