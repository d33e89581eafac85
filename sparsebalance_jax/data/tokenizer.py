"""Tokenizers: text <-> int32 token ids, and the special ids every document uses.

The default is byte level: the UTF-8 bytes of the text are the ids 0..255, so nothing is
downloaded and any text round-trips. Six special ids follow the bytes:

    PAD=256  padding between and after packed documents (never trained on)
    BOS=257  starts every document
    EOS=258  ends every document (trained on: the model learns to stop)
    USER=259, ASSISTANT=260, SYSTEM=261  open a conversation turn

so `vocab_size` is 262; `padded_vocab_size()` rounds it up (to 384 by default) for the model's
embedding table, whose extra rows are never produced. Only the "bytes" kind exists: a
SentencePiece or BPE file would need packages that are not pinned, and asking for one fails
instead of quietly falling back to bytes.
"""

from __future__ import annotations

import codecs
import dataclasses
from typing import Protocol

import numpy as np

TOKENIZER_KINDS = ("bytes",)

PAD_ID = 256
BOS_ID = 257
EOS_ID = 258
USER_ID = 259
ASSISTANT_ID = 260
SYSTEM_ID = 261
BYTE_VOCAB_SIZE = 262


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    pad: int
    bos: int
    eos: int
    user: int
    assistant: int
    system: int

    def role(self, role: str) -> int:
        """The id that opens a turn of `role` ("user", "assistant" or "system")."""
        ids = {"user": self.user, "assistant": self.assistant, "system": self.system}
        if role not in ids:
            raise ValueError(f"unknown conversation role {role!r}; expected one of {sorted(ids)}")
        return ids[role]


class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer."""

    kind: str
    special: SpecialIds
    vocab_size: int

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids) -> str: ...

    def padded_vocab_size(self, multiple: int = 128) -> int: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 plus the special ids above."""

    kind = "bytes"
    special = SpecialIds(pad=PAD_ID, bos=BOS_ID, eos=EOS_ID, user=USER_ID,
                         assistant=ASSISTANT_ID, system=SYSTEM_ID)
    vocab_size = BYTE_VOCAB_SIZE

    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text` (no specials), int32[len(text.encode())]."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        """Text of `ids`; special ids are dropped, invalid UTF-8 becomes U+FFFD, and a character
        cut short at the end (a generation stopped by its budget) is dropped."""
        ids_N = np.asarray(ids)
        data = ids_N[ids_N < 256].astype(np.uint8).tobytes()
        # Not final: an incomplete sequence at the end stays in the decoder, unreturned.
        return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=False)

    def padded_vocab_size(self, multiple: int = 128) -> int:
        """Vocabulary rounded up to `multiple` (embedding tables like aligned sizes)."""
        return -(-self.vocab_size // multiple) * multiple



def make_tokenizer(kind: str) -> Tokenizer:
    """The tokenizer named `kind`; an unknown kind raises (no silent fallback)."""
    if kind == "bytes":
        return ByteTokenizer()
    raise ValueError(
        f"tokenizer kind {kind!r} is not supported; supported kinds: {TOKENIZER_KINDS} "
        "(SentencePiece/BPE files need packages that are not in requirements.txt)")
