"""Loading tokenizers and causal LMs: a `save_pretrained` directory, a hub id (online) or a GGUF file.

Tokenizer rules (padding and EOS pitfalls: docs/algorithms.md §25, points 7 and 8):
- an EOS token is required: without it no response can end (`prepare_tokenizer` stops with the fix);
- a pad token is always set, preferring a real pad or unk token; EOS is reused as the pad *filler
  id* only as a last resort. That is safe here because every mask in this library is built from
  explicit lengths, never by comparing ids with `pad_token_id`;
- the padding side is never assumed: code that lets the tokenizer pad says which side it wants
  (`padding_side(tokenizer, "left")`); the collators of `rlhf.data` pad explicitly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlhf.models.files import check_weights_whole
from rlhf.models.trust import check_model_directory, safe_load_kwargs, unsafe_pickle_error

logger = logging.getLogger(__name__)

# Tokens that some vocabularies hold for padding without declaring them as the pad token.
PAD_TOKEN_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>", "<|finetune_right_pad_id|>")


class ModelLoadingError(ValueError):
    """A model or tokenizer could not be loaded or is unusable; the message names the path and the fix."""


def _source_name(tokenizer: PreTrainedTokenizerBase, source: str | os.PathLike | None) -> str:
    if source is not None:
        return str(source)
    return getattr(tokenizer, "name_or_path", "") or "<tokenizer built in memory>"


def prepare_tokenizer(
    tokenizer: PreTrainedTokenizerBase, *, source: str | os.PathLike | None = None
) -> PreTrainedTokenizerBase:
    """Check that `tokenizer` has an EOS token and give it a pad token; returns the same object.

    The pad token, when missing, is (in order of preference) a pad-like token already in the
    vocabulary, the unk token, then the EOS token as a filler id. The padding side is not touched.
    Raises `ModelLoadingError` naming the tokenizer's path and the fix when there is no EOS token.
    """
    name = _source_name(tokenizer, source)
    if tokenizer.eos_token_id is None:
        raise ModelLoadingError(
            f"The tokenizer loaded from {name!r} has no EOS token, so a sampled response could never "
            "end and no reward could be read at its last token. Fix: set one before training, e.g. "
            "`tokenizer.eos_token = '<|endoftext|>'` (a token of its vocabulary), or add "
            '"eos_token": "..." to tokenizer_config.json in that directory.'
        )
    if tokenizer.pad_token_id is not None:
        return tokenizer
    vocab = tokenizer.get_vocab()
    for candidate in PAD_TOKEN_CANDIDATES:
        if candidate in vocab:
            tokenizer.pad_token = candidate
            logger.info("Tokenizer %s: using its vocabulary token %r as the pad token.", name, candidate)
            return tokenizer
    if tokenizer.unk_token is not None and tokenizer.unk_token_id is not None:
        tokenizer.pad_token = tokenizer.unk_token
        logger.info("Tokenizer %s: no pad token, using the unk token %r.", name, tokenizer.unk_token)
        return tokenizer
    # Last resort: EOS as the pad filler id. Masks come from lengths, so a real EOS stays unmasked.
    tokenizer.pad_token = tokenizer.eos_token
    logger.info(
        "Tokenizer %s: no pad or unk token, using EOS %r as the pad filler id (masks come from lengths).",
        name,
        tokenizer.eos_token,
    )
    return tokenizer


@contextlib.contextmanager
def padding_side(tokenizer: PreTrainedTokenizerBase, side: str) -> Iterator[PreTrainedTokenizerBase]:
    """Temporarily set `tokenizer.padding_side` to "left" or "right" (restored on exit)."""
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    previous = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = previous


def _check_source(path: str | os.PathLike, gguf_file: str | None, needs_model_config: bool = True) -> None:
    """Fail early with the fix when a local path is given but is not loadable."""
    p = Path(path)
    if not p.exists():
        if str(path).startswith((".", "/", "~")) or str(path).count("/") > 1:
            raise ModelLoadingError(
                f"Model path {str(path)!r} does not exist. Fix: pass an existing directory."
            )
        check_hub_id(str(path))  # a hub id: transformers resolves it (network or the local cache)
        return
    if p.is_file() and gguf_file is None:
        raise ModelLoadingError(
            f"{str(path)!r} is a file; a model is loaded from a directory. Fix: for a GGUF file pass "
            f"path={str(p.parent)!r}, gguf_file={p.name!r}."
        )
    if gguf_file is not None:
        if not (p / gguf_file).is_file() and not Path(gguf_file).is_file():
            raise ModelLoadingError(
                f"GGUF file {gguf_file!r} not found in {str(path)!r}. Fix: pass the directory holding it "
                "as path and the file name as gguf_file."
            )
        return
    if (
        needs_model_config
        and p.is_dir()
        and not (p / "config.json").is_file()
        and not (p / "adapter_config.json").is_file()
    ):
        raise ModelLoadingError(
            f"{str(path)!r} has no config.json: it is not a save_pretrained directory. Fix: point to the "
            "directory written by save_pretrained, or pass gguf_file= for a GGUF checkpoint."
        )


HUB_PROBE_TIMEOUT = 10.0  # seconds for the one request that asks the hub whether a model exists


def hub_offline() -> bool:
    """Hugging Face's offline mode: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set to 1/true/yes/on."""
    from huggingface_hub import constants

    flags = (os.environ.get(name, "").strip().lower() for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag in ("1", "true", "yes", "on") for flag in flags) or bool(constants.HF_HUB_OFFLINE)


def in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds a download of model `repo_id`."""
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}").is_dir()


def _unreachable(err: BaseException) -> bool:
    """A failure to reach the hub at all (DNS, refused connection, timeout), not an HTTP answer."""
    names = {cls.__name__ for cls in type(err).__mro__}
    return bool(names & {"TransportError", "ConnectError", "ConnectionError", "Timeout", "TimeoutError"})


def check_hub_id(name: str) -> None:
    """`name` names no local path, so it must be a hub id: stop at once, naming the path and the
    fix, when it cannot be one (`validate_repo_id`), when offline mode is on and the cache lacks
    it, or when one request to the hub says there is no such model or gets no answer; otherwise
    transformers retries an unreachable hub for about a minute before giving up."""
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    here = f"There is no directory {name!r} (looked in {os.getcwd()})"
    fix = "Fix: pass the path of an existing save_pretrained directory (check its spelling and the working directory)"
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelLoadingError(f"{here}, and {name!r} is not a hub id (owner/name). {fix}.") from None
    if in_hub_cache(name):
        return
    if hub_offline():
        raise ModelLoadingError(
            f"{here}, and offline mode is on (HF_HUB_OFFLINE) with no hub model {name!r} in the cache. "
            f"{fix}, or download the model once while online."
        )
    from huggingface_hub import model_info

    try:
        model_info(name, timeout=HUB_PROBE_TIMEOUT)
    except RepositoryNotFoundError:
        raise ModelLoadingError(
            f"{here}, and the hub has no model {name!r} (or it is private: `hf auth login`). {fix}, "
            "or a hub id such as HuggingFaceTB/SmolLM2-135M."
        ) from None
    except HfHubHTTPError:
        return  # the hub answered (gated, rate-limited, ...): transformers says what it needs
    except Exception as err:  # noqa: BLE001 (only a hub that cannot be reached stops here)
        if not _unreachable(err):
            return
        raise ModelLoadingError(
            f"{here}, and the hub cannot be reached to look for {name!r} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no answer'}). {fix}; for a hub id, connect "
            "to the network (or set HF_HUB_OFFLINE=1 to use only the local cache)."
        ) from None


def _wrap_os_error(path: str | os.PathLike, err: OSError) -> ModelLoadingError:
    return ModelLoadingError(
        f"Could not load {str(path)!r}: {err}. Fix: pass a local save_pretrained directory or a GGUF file "
        "(gguf_file=), or connect to the hub for a hub id."
    )


def load_tokenizer(path: str | os.PathLike, gguf_file: str | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer (directory, hub id, or `gguf_file` inside `path`) and `prepare_tokenizer` it."""
    _check_source(path, gguf_file, needs_model_config=False)
    check_model_directory(path, weights=False)
    kwargs = {"gguf_file": gguf_file} if gguf_file is not None else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs, **safe_load_kwargs(weights=False))
    except OSError as err:
        raise _wrap_os_error(path, err) from err
    except ValueError as err:  # no tokenizer files, or files transformers cannot read
        raise ModelLoadingError(
            f"Could not load a tokenizer from {str(path)!r} ({str(err).splitlines()[0]}). Fix: save the "
            "tokenizer beside the model (`tokenizer.save_pretrained(DIR)`, or copy tokenizer.json and "
            "tokenizer_config.json from the base model)."
        ) from None
    source = os.path.join(str(path), gguf_file) if gguf_file else str(path)
    return prepare_tokenizer(tokenizer, source=source)


def _gguf_kwargs(gguf_file: str | None) -> dict:
    """`from_pretrained` arguments that load a GGUF file as plain dense weights.

    transformers >= 5 loads a GGUF through a quantizer (`GgufHfQuantizer`) and, unless told to
    dequantize, leaves `model.hf_quantizer` and `config.quantization_config` set even when every
    weight was unpacked to float; `save_pretrained` then refuses the model ("quantized with gguf and
    is not serializable"). Asking for `GgufConfig(dequantize=True)`, its documented option, makes the
    quantizer unpack every weight and remove itself and the quantization config after loading
    (`HfQuantizer.postprocess_model`), so a trained model saves as a normal directory. Older
    transformers have no `GgufConfig` and always dequantize without a quantizer.
    """
    if gguf_file is None:
        return {}
    try:
        from transformers import GgufConfig
    except ImportError:
        return {"gguf_file": gguf_file}
    return {"gguf_file": gguf_file, "quantization_config": GgufConfig(dequantize=True)}


def load_causal_lm(
    path: str | os.PathLike,
    gguf_file: str | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    on_meta: bool = False,
) -> PreTrainedModel:
    """Load a causal LM in `dtype` (None: float32; GGUF weights are dequantized) on `device`
    (None: the CPU), in eval mode. `on_meta`: only its structure, built from its config on the meta
    device, no weight read (a sharded run's ranks but 0, filled from rank 0: rlhf/parallel/fsdp.py)."""
    _check_source(path, gguf_file)
    check_model_directory(path, weights=gguf_file is None)
    if not on_meta:
        check_weights_whole(path)  # a file cut short: named here, not a SafetensorError mid-load
    if on_meta and gguf_file is None:
        return _causal_lm_on_meta(path, dtype or torch.float32)
    kwargs = _gguf_kwargs(gguf_file)
    kwargs.update(safe_load_kwargs(weights=gguf_file is None))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32, **kwargs)
    except OSError as err:
        raise _wrap_os_error(path, err) from err
    except pickle.UnpicklingError:
        raise unsafe_pickle_error(path) from None
    except (ValueError, KeyError) as err:  # an architecture this transformers does not know
        raise ModelLoadingError(
            f"Could not build the model of {str(path)!r} ({str(err).splitlines()[0]}). Fix: check model_type "
            "in its config.json; a newer transformers may know the architecture, or pass --trust-remote-code "
            "if the directory ships its own code (auto_map)."
        ) from None
    if device is not None:
        model.to(device)
    return model.eval()


def _causal_lm_on_meta(path: str | os.PathLike, dtype: torch.dtype) -> PreTrainedModel:
    """The causal LM of `path`'s config.json, every tensor on the meta device (no memory, no values)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path), **safe_load_kwargs(weights=False))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=safe_load_kwargs(weights=False)["trust_remote_code"]
        )
    return model.eval()
