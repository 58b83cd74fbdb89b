"""
GPT-2 weights in other people's files: llm.c's GPT-2 model files (write and read; versions
3 = fp32 and 5 = bf16; doc/formats.md "GPT-2 checkpoints", llm.c compatibility) and the
pretrained GPT-2 of Hugging Face (needs the network).
"""

import json
import math
import os
import struct

import numpy as np

from attnref.container import ContainerError, bf16_bits_to_fp32, fp32_to_bf16_bits, load_params_into
from attnref.gpt2 import GPT2, PRESETS, GPT2Config, parameter_spec
from attnref.sizes import GPT2_LAYER_FIELDS

# -----------------------------------------------------------------------------------------
# llm.c model files (doc/formats.md "GPT-2 checkpoints", llm.c compatibility)

LLMC_MAGIC = 20240326
LLMC_VERSION_FP32 = 3
LLMC_VERSION_BF16 = 5
# llm.c stores each kind of tensor for all layers together, in this order
LLMC_LAYER_ORDER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                    "mlp.c_proj.weight", "mlp.c_proj.bias"]


def write_llmc(path, model, dtype="fp32"):
    """llm.c GPT-2 model file: 256 int32 header [magic, version (3 fp32, 5 bf16), maxT, V, L,
    H, C, Vp, 0...], then wte (Vp, C), wpe (maxT, C), each per-layer kind stacked over the
    layers in LLMC_LAYER_ORDER, ln_f weight and bias."""
    cfg = model.cfg
    p = {n: t.detach().cpu().float().numpy() for n, t in model.ordered_parameters()}
    header = np.zeros(256, dtype="<i4")
    header[:8] = [LLMC_MAGIC, LLMC_VERSION_FP32 if dtype == "fp32" else LLMC_VERSION_BF16, cfg.seq_len,
                  cfg.vocab_size, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.padded_vocab_size]
    arrays = [p["wte"], p["wpe"]]
    arrays += [np.stack([p[f"layers.{i}.{name}"] for i in range(cfg.n_layer)]) for name in LLMC_LAYER_ORDER]
    arrays += [p["ln_f.weight"], p["ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for a in arrays:
            if dtype == "fp32":
                f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
            else:
                f.write(fp32_to_bf16_bits(np.ascontiguousarray(a, dtype=np.float32)).astype("<u2").tobytes())


def read_llmc(path, bos_id=None):
    """(GPT2Config, {name: fp32 array}) from an llm.c GPT-2 model file (version 3 or 5)."""
    size = os.path.getsize(path)
    header = np.fromfile(path, dtype="<i4", count=256)
    if len(header) < 256 or header[0] != LLMC_MAGIC:
        raise ContainerError(f"{path}: not an llm.c GPT-2 model file (magic {header[0] if len(header) else None}, "
                             f"expected {LLMC_MAGIC})")
    if header[1] not in (LLMC_VERSION_FP32, LLMC_VERSION_BF16):
        raise ContainerError(f"{path}: llm.c model version {header[1]} (this reader knows 3 = fp32, 5 = bf16)")
    maxT, V, L, H, C, Vp = (int(x) for x in header[2:8])
    if min(maxT, V, L, H, C, Vp) <= 0:
        raise ContainerError(f"{path}: header sizes must be positive (T {maxT}, V {V}, L {L}, heads {H}, d {C}, "
                             f"Vp {Vp})")
    if Vp < V:
        raise ContainerError(f"{path}: padded vocab {Vp} < vocab {V}")
    cfg = GPT2Config(vocab_size=V, seq_len=maxT, n_layer=L, n_embd=C, n_head=H,
                     bos_id=bos_id if bos_id is not None else (50256 if V == 50257 else 0))
    d = C
    shapes = [("wte", (Vp, d)), ("wpe", (maxT, d))]
    shapes += [(name, (L,) + dict(GPT2_LAYER_FIELDS)[name](d)) for name in LLMC_LAYER_ORDER]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    itemsize = 4 if header[1] == LLMC_VERSION_FP32 else 2
    expected = 1024 + sum(math.prod(s) for _, s in shapes) * itemsize
    if size != expected:
        raise ContainerError(f"{path}: {size} bytes, expected {expected} for this header")
    raw = np.fromfile(path, dtype="<f4" if itemsize == 4 else "<u2", offset=1024)
    tensors, off = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        a = raw[off:off + n].reshape(shape)
        tensors[name] = bf16_bits_to_fp32(a) if itemsize == 2 else a.astype(np.float32)
        off += n
    out = {"wte": np.zeros((cfg.padded_vocab_size, d), np.float32), "wpe": tensors["wpe"],
           "ln_f.weight": tensors["ln_f.weight"], "ln_f.bias": tensors["ln_f.bias"]}
    out["wte"][:V] = tensors["wte"][:V]
    for name in LLMC_LAYER_ORDER:
        for i in range(L):
            out[f"layers.{i}.{name}"] = tensors[name][i]
    return cfg, out


# -----------------------------------------------------------------------------------------
# Pretrained GPT-2 from Hugging Face (needs the network)

# Hugging Face's GPT-2 stores these four as Conv1D weights, (in, out): transposed here
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def read_safetensors(path):
    """{name: fp32 array} from a .safetensors file (8-byte header length, JSON header,
    raw little-endian data), without the safetensors package. Every length and offset is
    checked against the file's size before it is read."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 <= n <= size - 8:
            raise ContainerError(f"{path}: header length {n} does not fit the file's {size} bytes")
        header = json.loads(f.read(n))
        base = 8 + n
    dtypes = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in dtypes:
            continue  # e.g. the boolean attention-mask buffers of old exports
        begin, end = info["data_offsets"]
        itemsize = np.dtype(dtypes[info["dtype"]]).itemsize
        if not 0 <= begin <= end <= size - base or end - begin != math.prod(info["shape"]) * itemsize:
            raise ContainerError(f"{path}: tensor {name}: data [{begin}, {end}) do not fit the file or its shape "
                                 f"{info['shape']}")
        a = np.fromfile(path, dtype=dtypes[info["dtype"]], count=(end - begin) // np.dtype(dtypes[info["dtype"]]).itemsize,
                        offset=base + begin).reshape(info["shape"])
        out[name] = bf16_bits_to_fp32(a) if info["dtype"] == "BF16" else a.astype(np.float32)
    return out


def load_hf_weights(name):
    """{hf name without the 'transformer.' prefix: fp32 array} of a pretrained GPT-2
    (gpt2, gpt2-medium, gpt2-large, gpt2-xl): through transformers when it is installed,
    else the repository's model.safetensors through huggingface_hub."""
    try:
        from transformers import GPT2LMHeadModel
        sd = {k: v.float().numpy() for k, v in GPT2LMHeadModel.from_pretrained(name).state_dict().items()}
    except ImportError:
        from huggingface_hub import hf_hub_download
        repo = name if "/" in name else f"openai-community/{name}"
        sd = read_safetensors(hf_hub_download(repo, "model.safetensors"))
    return {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in sd.items()}


def gpt2_from_hf(name, seq_len=None):
    """Our GPT2 with the pretrained weights of Hugging Face model `name` (its preset's
    size; seq_len may shorten the context: wpe keeps its first rows)."""
    preset = name.split("/")[-1]  # "gpt2" or "openai-community/gpt2"
    if preset not in PRESETS:
        raise ValueError(f"--init-from-hf: unknown model {name!r} (gpt2, gpt2-medium, gpt2-large, gpt2-xl)")
    kw = dict(PRESETS[preset])
    if seq_len:
        kw["seq_len"] = seq_len
    cfg = GPT2Config(**kw)
    sd = load_hf_weights(name)
    tensors = {}
    for ours, shape in parameter_spec(cfg):
        if ours == "wte":
            w = np.zeros(shape, np.float32)
            w[: cfg.vocab_size] = sd["wte.weight"]
        elif ours == "wpe":
            w = sd["wpe.weight"][: cfg.seq_len]
        else:
            hf = ours.replace("layers.", "h.", 1)
            w = sd[hf].T if ours.endswith(HF_TRANSPOSED) else sd[hf]
        tensors[ours] = np.ascontiguousarray(w)
    model = GPT2(cfg)
    load_params_into(model, tensors, f"huggingface:{name}")
    return model


