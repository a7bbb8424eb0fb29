"""A transformers tokenizer for Kimi K2.5 that needs no remote code.

The release's ``tokenization_kimi.py`` is remote code, which we never run; this is a
``PreTrainedTokenizer`` (transformers 5's ``PythonBackend``) over the same tiktoken encoding as
:mod:`eagle_assets.tokenization.kimi_tokenizer`, so HF-facing code (collators, ``AutoModel`` helpers,
SGLang/vLLM-style call sites) and our pipeline agree on every id. Tokens are GPT-2 byte-level
strings, as in the remote code, so ``convert_tokens_to_ids``/``convert_ids_to_tokens`` round-trip.

Two deliberate differences from a stock slow tokenizer:

- ``tokenize``/``decode`` call tiktoken directly instead of HF's Python trie split (identical
  output: both split at the same special tokens; far faster on long texts).
- ``apply_chat_template`` does what the release's does before rendering (tools deep-sorted and
  declared in TypeScript, see :mod:`eagle_assets.tokenization.tool_declaration`), and with
  ``tokenize=True`` encodes through :func:`encode_chat`: special-token text inside messages becomes
  its special id, as on the serving path, unless ``data_specials="ordinary"`` (or
  ``sanitize_control_tokens=True``) keeps it ordinary text, without HF's re-split of the
  neighbouring text, which changes BPE merges.

``eos_token`` is the release config's (``[EOS]``); the end of an assistant turn, and what the model
stops on, is ``<|im_end|>`` (``KimiTokenizer.eos_id``). Pass ``eos_token="<|im_end|>"`` to change it.
"""

import shutil
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from transformers import BatchEncoding, PreTrainedTokenizer
from transformers.tokenization_utils_base import AddedToken

from eagle_assets.tokenization.chat_encoding import DataSpecials, encode_chat, render_kimi_chat
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer, load_kimi_tokenizer
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from eagle_assets.tokenization.tool_declaration import declare_tools


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte→printable-character map, used by the remote code's token strings.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


@lru_cache(maxsize=4)
def _vocab_tables(directory: str) -> tuple[tuple[str, ...], dict[str, int]]:
    kimi = load_kimi_tokenizer(directory)
    byte_map = _bytes_to_unicode()
    tokens = [""] * kimi.vocab_size
    for name, token_id in kimi.special_tokens.items():
        tokens[token_id] = name
    for rank in range(kimi.vocab_size):
        if not tokens[rank]:
            tokens[rank] = "".join(byte_map[b] for b in kimi.encoding.decode_single_token_bytes(rank))
    return tuple(tokens), {t: i for i, t in enumerate(tokens)}


def _is_batch(conversation: Any) -> bool:
    return bool(conversation) and isinstance(conversation[0], list | tuple)


class KimiHFTokenizer(PreTrainedTokenizer):
    """Kimi K2.5 tokenizer with the transformers API; see the module docstring for the choices made."""

    vocab_files_names = {"vocab_file": "tiktoken.model"}  # noqa: RUF012 (HF's class attribute protocol)
    model_input_names = ["input_ids", "attention_mask"]  # noqa: RUF012

    def __init__(
        self,
        vocab_file: str | Path | None = None,
        bos_token: str = "[BOS]",
        eos_token: str = "[EOS]",
        unk_token: str = "[UNK]",
        pad_token: str = "[PAD]",
        **kwargs: Any,
    ) -> None:
        self.kimi: KimiTokenizer = load_kimi_tokenizer(Path(vocab_file).parent if vocab_file else None)
        self._tokens, self._token_to_id = _vocab_tables(str(self.kimi.directory))
        self._special_ids = frozenset(self.kimi.id_to_special)
        self._added_tokens_decoder = {
            i: AddedToken(name, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
            for i, name in self.kimi.id_to_special.items()
        }
        kwargs.pop("added_tokens_decoder", None)  # the tiktoken table is authoritative (all 256 specials)
        kwargs.setdefault("chat_template", self.kimi.chat_template)
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self.kimi.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return dict(self._token_to_id)

    def __len__(self) -> int:
        return self.kimi.vocab_size

    def tokenize(
        self, text: str, pair: str | None = None, add_special_tokens: bool = False, **kwargs: Any
    ) -> list[str]:
        # HF's signature; ``pair`` and ``add_special_tokens`` change nothing here (the encoder adds no specials).
        split_special = kwargs.pop("split_special_tokens", self.split_special_tokens)
        ids = self.kimi.encode_ordinary(text) if split_special else self.kimi.encode_with_special(text)
        return [self._tokens[i] for i in ids]

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self._tokens[i] for i in self.kimi.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._token_to_id.get(token, self._token_to_id[str(self.unk_token)])

    def _convert_id_to_token(self, index: int) -> str:
        return self._tokens[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.kimi.decode([self._token_to_id[t] for t in tokens])

    def _decode(
        self,
        token_ids: int | list[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        text = self.kimi.decode(ids)
        if (
            clean_up_tokenization_spaces
            if clean_up_tokenization_spaces is not None
            else self.clean_up_tokenization_spaces
        ):
            text = self.clean_up_tokenization(text)
        return text

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        target = Path(save_directory) / f"{filename_prefix + '-' if filename_prefix else ''}tiktoken.model"
        if target.resolve() != (self.kimi.directory / "tiktoken.model").resolve():
            shutil.copyfile(self.kimi.directory / "tiktoken.model", target)
        return (str(target),)

    # HF's own parameters, with a wider conversation (tool calls) and without ones our encoder has no use for.
    def apply_chat_template(  # type: ignore[override]
        self,
        conversation: Sequence[Any],
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, str]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_dict: bool = True,
        return_assistant_tokens_mask: bool = False,
        tokenizer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """HF's signature and return shapes, the release tokenizer's tool handling (see module docstring)."""
        data_specials: DataSpecials = kwargs.pop("data_specials", "special")
        if kwargs.pop("sanitize_control_tokens", False):
            data_specials = "ordinary"
        if continue_final_message or return_assistant_tokens_mask or documents:
            # Rare HF features our encoder does not model: HF's own encoding (data specials become ids),
            # with the release's tool declaration.
            declaration = declare_tools(tools)
            return super().apply_chat_template(
                conversation,  # type: ignore[arg-type]  # HF types messages as dict[str, str]: ours hold tool calls
                tools=declaration.tools,
                documents=documents,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=tokenize,
                padding=padding,
                truncation=truncation,
                max_length=max_length,
                return_tensors=return_tensors,
                return_dict=return_dict,
                return_assistant_tokens_mask=return_assistant_tokens_mask,
                tokenizer_kwargs=tokenizer_kwargs,
                **{**kwargs, **declaration.template_kwargs()},
            )
        template = self.get_chat_template(chat_template, tools)
        batched = _is_batch(conversation)
        chats = list(conversation) if batched else [conversation]
        if not chats or not all(chats):
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        specials = {k: str(v) for k, v in self.special_tokens_map.items() if isinstance(v, str | AddedToken)}
        if not tokenize:
            variables = {**specials, **kwargs}
            texts = [render_kimi_chat(template, c, tools, add_generation_prompt, **variables) for c in chats]
            return texts if batched else texts[0]
        ids = [
            encode_chat(
                self.kimi,
                c,
                tools,
                add_generation_prompt,
                chat_template=template,
                template_vars=specials,
                data_specials=data_specials,
                **kwargs,
            )
            for c in chats
        ]
        if truncation and max_length is not None:
            ids = [x[:max_length] for x in ids]
        if not return_dict:
            if return_tensors is not None:  # a (batch, length) tensor, also for one chat, as HF returns
                return BatchEncoding({"input_ids": ids}, tensor_type=return_tensors)["input_ids"]
            return ids if batched else ids[0]
        enc: dict[str, Any] = {"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]}
        if not batched:
            enc = {k: v[0] for k, v in enc.items()}
        if padding or (return_tensors is not None and batched):
            return self.pad(enc, padding=padding or "longest", max_length=max_length, return_tensors=return_tensors)
        return BatchEncoding(enc, tensor_type=return_tensors, prepend_batch_axis=return_tensors is not None)


def load_hf_tokenizer(directory: str | Path | None = None, **kwargs: Any) -> KimiHFTokenizer:
    """``KimiHFTokenizer.from_pretrained`` on a local directory (default: the configured Kimi tokenizer
    folder, see ``resolve_tokenizer_dir``), never touching the network."""
    folder = resolve_tokenizer_dir(directory)
    return KimiHFTokenizer.from_pretrained(str(folder), local_files_only=True, **kwargs)
