"""Rows as users have them: chat (``messages``), prompt/completion and plain text, turned into token ids
and labels.

Chat rows follow the OpenAI/TRL convention, ``{"messages": [{"role": "user", "content": "..."}, ...]}``,
and are rendered with the tokenizer's chat template; the builtin tokenizer has none, so it gets
:data:`BUILTIN_CHAT_TEMPLATE`. With ``data.train_on = "completions"`` only assistant turns (chat) or the
completion (prompt/completion rows) are learned: every other token's label is -100.

Which tokens are an assistant's is decided on the rendered text, not by re-tokenizing pieces (BPE is not
prefix-stable across a cut): the template is rendered for the conversation up to each assistant turn
(with the generation prompt) and up to its end, which gives that turn's character span; the whole text is
tokenized once with offsets, and a token is learned when it starts inside such a span.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from runner.spec.recipe import DataSection

ROLES = ("system", "user", "assistant", "tool")
IGNORE = -100
"""The label of a token that is not learned (PyTorch's cross-entropy ``ignore_index``)."""

BUILTIN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""The builtin tokenizer's chat template: a role header line, the content, then end-of-text, so that a
trained model ends its turn with the token generation stops at."""

Format = Literal["text", "chat", "completion"]


class RowError(ValueError):
    """A row that cannot be used: the message says what (the caller adds the file and row)."""


@dataclass(frozen=True)
class Encoded:
    """Token ids of rows and their labels (:data:`IGNORE` where a token is not learned)."""

    ids: list[list[int]]
    labels: list[list[int]]


def row_format(row: Any, data: DataSection) -> Format:
    """The format of ``row`` under ``data.format`` (``auto``: by the row's fields)."""
    if data.format != "auto":
        return data.format
    if isinstance(row, dict):
        if data.messages_field in row:
            return "chat"
        if data.prompt_field in row and data.completion_field in row:
            return "completion"
    return "text"


def check_messages(row: Any, data: DataSection) -> list[dict[str, str]]:
    """The ``messages`` of a chat row, checked: a non-empty list of ``{"role", "content"}`` with known
    roles and text content; with ``train_on = "completions"`` at least one assistant turn.

    Raises:
        RowError: what is wrong with the row.
    """
    field = data.messages_field
    if not isinstance(row, dict):
        raise RowError("is not an object")
    if field not in row:
        raise RowError(f"has no field {field!r} (fields: {', '.join(map(str, row)) or 'none'})")
    messages = row[field]
    if not isinstance(messages, list) or not messages:
        raise RowError(f"{field!r} must be a non-empty list of {{role, content}} messages")
    out: list[dict[str, str]] = []
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise RowError(f"message {number} must be an object with 'role' and 'content'")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise RowError(f"message {number}: unknown role {role!r} (roles: {', '.join(ROLES)})")
        if not isinstance(content, str):
            raise RowError(f"message {number}: content must be text")
        out.append({"role": role, "content": content})
    if data.train_on == "completions" and not any(m["role"] == "assistant" for m in out):
        raise RowError("has no assistant message to learn from (data.train_on = completions)")
    return out


def check_completion(row: Any, data: DataSection) -> tuple[str, str]:
    """The prompt and completion of a prompt/completion row (both text)."""
    if not isinstance(row, dict):
        raise RowError("is not an object")
    for field in (data.prompt_field, data.completion_field):
        if field not in row:
            raise RowError(f"has no field {field!r} (fields: {', '.join(map(str, row)) or 'none'})")
        if not isinstance(row[field], str):
            raise RowError(f"field {field!r} must be text")
    return row[data.prompt_field], row[data.completion_field]


def ensure_chat_template(tokenizer: Any, builtin: bool) -> None:
    """Give the builtin tokenizer its chat template (a hub tokenizer keeps its own)."""
    if builtin or not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = BUILTIN_CHAT_TEMPLATE


def render(tokenizer: Any, messages: Sequence[dict[str, str]], generation_prompt: bool = False) -> str:
    """The chat template's text for ``messages``."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
    return str(text)


def chat_text(tokenizer: Any, messages: list[dict[str, str]], completions_only: bool) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans that are learned (the whole text, or each
    assistant turn without its header).

    Raises:
        RowError: the template renders a conversation's start differently from the whole.
    """
    full = render(tokenizer, messages)
    if not completions_only:
        return full, [(0, len(full))]
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], generation_prompt=True) if i else _empty_prompt(tokenizer)
        upto = render(tokenizer, messages[: i + 1])
        if not (full.startswith(upto) and upto.startswith(before)):
            raise RowError("the chat template does not render a conversation's start as a prefix of the whole "
                           "(cannot tell assistant tokens apart; use data.train_on = \"all\")")
        spans.append((len(before), len(upto)))
    return full, spans


def _empty_prompt(tokenizer: Any) -> str:
    try:
        return render(tokenizer, [], generation_prompt=True)
    except Exception:  # noqa: BLE001 (templates that index messages[0]: nothing precedes the first turn)
        return ""


def encode(rows: Sequence[Any], fmt: Format, data: DataSection, tokenizer: Any,
           where: Any = None) -> Encoded:
    """Token ids and labels of chat or prompt/completion rows (all checked first), tokenized in one batch.

    Args:
        rows: the rows.
        fmt: ``chat`` or ``completion``.
        data: the recipe's data section (fields, ``train_on``, ``context_length``).
        tokenizer: a fast tokenizer (offsets are needed).
        where: ``where(index)`` names a row for errors ("chat.jsonl row 12").

    Raises:
        RowError: a bad row or one longer than ``data.context_length``; the message names it via ``where``.
    """
    name = where or (lambda index: f"row {index + 1}")
    completions_only = data.train_on == "completions"
    texts: list[str] = []
    spans: list[list[tuple[int, int]]] = []
    for index, row in enumerate(rows):
        try:
            if fmt == "chat":
                text, learned = chat_text(tokenizer, check_messages(row, data), completions_only)
            else:
                prompt, completion = check_completion(row, data)
                text = prompt + completion
                learned = [(len(prompt) if completions_only else 0, len(text))]
        except RowError as exc:
            raise RowError(f"{name(index)}: {exc}") from None
        texts.append(text)
        spans.append(learned)
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    eos = tokenizer.eos_token_id
    limit = data.context_length
    all_ids: list[list[int]] = []
    all_labels: list[list[int]] = []
    for index, (ids, offsets, learned) in enumerate(zip(encoded["input_ids"], encoded["offset_mapping"], spans,
                                                        strict=True)):
        labels = [tok if _inside(start, learned) else IGNORE for tok, (start, _end) in zip(ids, offsets, strict=True)]
        if fmt == "completion" and eos is not None:  # the model learns to end its completion
            ids = [*ids, eos]
            labels.append(eos)
        if len(ids) > limit:
            kind = "conversation" if fmt == "chat" else "prompt + completion"
            raise RowError(f"{name(index)}: {kind} of {len(ids)} tokens is longer than data.context_length "
                           f"= {limit}")
        all_ids.append(list(ids))
        all_labels.append(labels)
    return Encoded(all_ids, all_labels)


def _inside(position: int, spans: list[tuple[int, int]]) -> bool:
    return any(start <= position < end for start, end in spans)


def prompt_ids(tokenizer: Any, prompt: str, fmt: Format) -> list[int]:
    """The token ids generation starts from for an ``eval.prompts`` entry: a user turn with the
    generation prompt for chat data, the text itself otherwise."""
    if fmt == "chat":
        text = render(tokenizer, [{"role": "user", "content": prompt}], generation_prompt=True)
    else:
        text = prompt
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
