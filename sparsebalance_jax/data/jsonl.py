"""Local jsonl conversation files (LongAlign / ChatQA-style): validation, indexing, reading.

One JSON object per line, in any of these layouts (as published by the datasets):

- LongAlign-10k: ``{"messages": [{"role": "user"|"assistant"|"system", "content": str}, ...]}``
- ChatQA (ChatQA-Training-Data / ChatQA2 "messages" variant): the same ``messages``, plus an
  optional ``"document"`` (context, prepended to the first user turn) and optional
  ``"answers"`` (list of str, or str) giving the final assistant turn when ``messages`` ends
  with the user.
- ChatQA2-Long-SFT ``long_sft`` rows: ``{"question": str, "answer": str | [str, ...],
  "sub-paragraphs": str (optional context)}``; the first answer is the target. (The dataset is
  published as JSON arrays; write one object per line to use it here.)
- NeMo SFT style: ``{"input": str, "output": str, "context": str (optional)}``.

Loss is on assistant turns only (documents.chat_tokens). Files are scanned once at start: every
line is parsed and checked, and each bad line is logged as ``path:line: reason`` and counted;
passing `max_bad_lines` raises `MalformedDataError` naming the file and line. Good lines are
remembered by byte offset and re-read on access, so large files are never held in memory.
Blank lines hold no record and are not counted.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

Turns = list[tuple[str, str]]
_ROLES = ("user", "assistant", "system")


class MalformedDataError(ValueError):
    """A data file has more malformed lines than allowed; the message names file and line."""


class RecordError(ValueError):
    """One record does not match any supported layout (the message says why)."""


def _text(value: Any, field: str, *, null_is_empty: bool = False) -> str:
    """The string `value` of `field`; None is "" only where `null_is_empty` (an optional
    context, or a message's content: LongAlign has a few null contents, meaning an empty
    turn), else an error: a null question, input or answer is a broken record, not an empty
    prompt."""
    if value is None:
        if null_is_empty:
            return ""
        raise RecordError(f"field {field!r} is null")
    if not isinstance(value, str):
        raise RecordError(f"field {field!r} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        # JSON may escape a lone surrogate ("\ud83d", half an emoji): it parses, but UTF-8
        # cannot encode it for the tokenizer.
        raise RecordError(f"field {field!r} is not valid Unicode text: {e.reason} at "
                          f"character {e.start}") from e
    return value


def _first_answer(value: Any, field: str) -> str:
    if isinstance(value, list):
        if not value:
            raise RecordError(f"field {field!r} is an empty list")
        value = value[0]
    return _text(value, field)


def _with_context(context: Any, field: str, prompt: str) -> str:
    context = _text(context, field, null_is_empty=True)
    return f"{context}\n\n{prompt}" if context.strip() else prompt


def parse_record(obj: Any) -> Turns:
    """The conversation [(role, content), ...] of one parsed jsonl record; raises RecordError."""
    if not isinstance(obj, dict):
        raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            raise RecordError("'messages' must be a non-empty list")
        turns: Turns = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in _ROLES:
                raise RecordError(f"messages[{i}] needs a 'role' in {_ROLES}, got {m!r:.80}")
            turns.append((m["role"], _text(m.get("content"), f"messages[{i}].content",
                                         null_is_empty=True)))
        if "document" in obj:
            first_user = next((i for i, (r, _) in enumerate(turns) if r == "user"), None)
            if first_user is None:
                raise RecordError("'document' given but no user turn to attach it to")
            turns[first_user] = ("user", _with_context(obj["document"], "document",
                                                       turns[first_user][1]))
        if "answers" in obj and turns[-1][0] != "assistant":
            turns.append(("assistant", _first_answer(obj["answers"], "answers")))
    elif "question" in obj and "answer" in obj:
        prompt = _with_context(obj.get("sub-paragraphs"), "sub-paragraphs",
                               _text(obj["question"], "question"))
        turns = [("user", prompt), ("assistant", _first_answer(obj["answer"], "answer"))]
    elif "input" in obj and "output" in obj:
        prompt = _with_context(obj.get("context"), "context", _text(obj["input"], "input"))
        turns = [("user", prompt), ("assistant", _text(obj["output"], "output"))]
    else:
        raise RecordError(f"unrecognised layout with keys {sorted(obj)[:8]}; expected "
                          "'messages', 'question'+'answer' or 'input'+'output'")
    if not any(role == "assistant" and content.strip() for role, content in turns):
        raise RecordError("no non-empty assistant turn to train on")
    return turns


class JsonlIndex:
    """Validated records of one or more jsonl files, random access by record number.

    Attributes:
      bad_lines: [(path, line number (1-based), reason)] of every malformed line.
    """

    def __init__(self, paths: tuple[str, ...] | list[str], max_bad_lines: int = 0):
        if max_bad_lines < 0:
            raise ValueError(f"max_bad_lines must be >= 0, got {max_bad_lines}")
        self.paths = tuple(paths)
        self.bad_lines: list[tuple[str, int, str]] = []
        file_ids, offsets, sizes = [], [], []
        for file_id, path in enumerate(self.paths):
            before = len(offsets)
            with open(path, "rb") as f:
                offset = 0
                for line_number, line in enumerate(f, start=1):
                    reason = self._check(line) if line.strip() else "blank"
                    if reason is None:
                        file_ids.append(file_id)
                        offsets.append(offset)
                        sizes.append(len(line))
                    elif reason != "blank":
                        self._report(path, line_number, reason, max_bad_lines)
                    offset += len(line)
            # Each file must give records: an empty or wrong file among good ones is a mistake
            # in the paths, not data to train around.
            if len(offsets) == before:
                raise MalformedDataError(
                    f"{path}: no usable records ({sum(p == path for p, _, _ in self.bad_lines)} "
                    f"malformed lines, the rest blank)")
        self._file_ids = np.asarray(file_ids, np.int32)
        self._offsets = np.asarray(offsets, np.int64)
        self._sizes = np.asarray(sizes, np.int64)
        if self.bad_lines:
            logging.warning("skipped %d malformed jsonl lines of %d (limit max_bad_lines=%d)",
                            len(self.bad_lines), len(self.bad_lines) + len(offsets), max_bad_lines)

    @staticmethod
    def _check(line: bytes) -> str | None:
        try:
            parse_record(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return f"invalid JSON ({e})"
        except RecordError as e:
            return str(e)
        return None

    def _report(self, path: str, line_number: int, reason: str, max_bad_lines: int) -> None:
        self.bad_lines.append((path, line_number, reason))
        logging.warning("%s:%d: malformed record skipped: %s", path, line_number, reason)
        if len(self.bad_lines) > max_bad_lines:
            raise MalformedDataError(
                f"{path}:{line_number}: {reason} -- {len(self.bad_lines)} malformed lines, more "
                f"than max_bad_lines={max_bad_lines} (earlier: "
                f"{[f'{p}:{n}' for p, n, _ in self.bad_lines[:-1][:5]]})")

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index: int) -> Turns:
        index = int(index)
        with open(self.paths[self._file_ids[index]], "rb") as f:
            f.seek(int(self._offsets[index]))
            line = f.read(int(self._sizes[index]))
        return parse_record(json.loads(line))
