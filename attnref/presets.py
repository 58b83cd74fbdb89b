"""
The presets and recipes as data for the Python side, read from the files the Makefile compiles
into the trainers: presets/NAME.conf (train_san), presets/gpt2/NAME.conf (train_gpt2),
presets/rates/NAME.conf (default rates) and presets/recipes/NAME.conf (--paper-setup,
--deconstructing-setup). The format is --config's (doc/formats.md "Config files"); model
settings stay text here until model_config types them as a config's fields.
"""
import os
from dataclasses import dataclass, field, fields

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET_DIR = os.path.join(ROOT, "presets")
GPT2_PRESET_DIR = os.path.join(PRESET_DIR, "gpt2")
RECIPE_DIR = os.path.join(PRESET_DIR, "recipes")
RATES_DIR = os.path.join(PRESET_DIR, "rates")
SWEPT_SOURCE_KEYS = ("swept-by", "swept-study", "swept-report", "swept-vocab-size")
RATE_KEYS = ("muon", "muon-other", "adamw")


class PresetFileError(ValueError):
    """A preset or recipe file that does not read: the message names the file and the line."""


def read_conf(path):
    """[(key, value, line)] of a `key = value` file, as llmc/config_file.h parse_config_text reads it."""
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for number, text in enumerate(lines, 1):
        s = text.strip()
        if not s or s.startswith("#"):
            continue
        key, eq, value = s.partition("=")
        if not eq or not key.strip():
            raise PresetFileError(f"{path} line {number}: expected `key = value` (a flag's name without --), got {s!r}")
        key, value = key.strip(), value.strip()
        if key.startswith("--"):
            key = key[2:]
        if value.startswith('"'):
            value = _unquote(value, f"{path} line {number}: the quoted value of {key}")
        out.append((key, value, number))
    return out


def _unquote(value, where):
    text, i = "", 1
    while i < len(value) and value[i] != '"':
        if value[i] == "\\" and i + 1 < len(value):
            i += 1
            text += "\n" if value[i] == "n" else value[i]
        else:
            text += value[i]
        i += 1
    if i != len(value) - 1:
        raise PresetFileError(f"{where} {'has no closing quote' if i >= len(value) else 'has text after its closing quote'}")
    return text


@dataclass
class SweptRates:
    """A preset arm's default peak rates per device: the best of a sweep at one vocabulary."""
    ffn: str             # the arm: the preset with this --ffn
    vocab_size: int      # the vocabulary swept (the rates hold only there)
    muon: float          # Muon's matrix rate
    muon_other: float    # Muon's AdamW side
    adamw: float         # AdamW's rate
    source: dict         # swept-by, swept-study, swept-report, swept-vocab-size as written


@dataclass
class Preset:
    name: str
    path: str
    model: dict                      # {flag name without --: value text}
    tuned_for: str = ""              # a recipe, or ""
    swept: list = field(default_factory=list)   # [SweptRates]


def read_preset(path):
    """A Preset: every model flag of its trainer (without the --), and for a train_san preset
    optionally tuned-for (the recipe its default rates were tuned for) and the sweep that chose
    its default rates: swept-by, swept-study, swept-report, swept-vocab-size, and the rates of its
    arm (or of it with --ffn KIND) swept-[ffn-KIND-]muon, -muon-other, -adamw."""
    name = os.path.basename(path)[:-len(".conf")]
    model, swept, tuned_for, seen = {}, {}, "", set()
    for key, value, line in read_conf(path):
        if key in seen:
            raise PresetFileError(f"{path} line {line}: {key} is set twice in the file")
        seen.add(key)
        if key == "tuned-for":
            tuned_for = value
        elif key.startswith("swept-"):
            swept[key] = (value, line)
        else:
            model[key] = value
    preset = Preset(name, path, model, tuned_for)
    if swept:
        preset.swept = _swept_rates(path, model.get("ffn"), swept)
    return preset


def _swept_rates(path, own_ffn, keys):
    missing = [k for k in SWEPT_SOURCE_KEYS if k not in keys]
    if missing:
        raise PresetFileError(f"{path} has swept rates but no {missing[0]} (the sweep that chose them)")
    arms = {}   # {ffn: {rate key: value}}
    for key, (value, line) in keys.items():
        if key in SWEPT_SOURCE_KEYS:
            continue
        rest = key[len("swept-"):]
        rate = next((r for r in ("muon-other", "muon", "adamw") if rest.endswith(r)), None)
        arm = rest[:-len(rate)] if rate else None
        if rate is None or not (arm == "" or (arm.startswith("ffn-") and arm.endswith("-") and len(arm) > 5)):
            raise PresetFileError(f"{path} line {line}: unknown key {key!r} (swept rates are "
                                  f"swept-[ffn-KIND-]muon, -muon-other, -adamw)")
        try:
            arms.setdefault(arm[4:-1] if arm else own_ffn, {})[rate] = float(value)
        except ValueError:
            raise PresetFileError(f"{path} line {line}: {key} = {value!r} is not a number") from None
    source = {k: keys[k][0] for k in SWEPT_SOURCE_KEYS}
    out = []
    for ffn, rates in arms.items():
        if set(rates) != set(RATE_KEYS):
            raise PresetFileError(f"{path}: the swept rates of the {ffn} arm need muon, muon-other and adamw")
        out.append(SweptRates(ffn, int(source["swept-vocab-size"]), rates["muon"], rates["muon-other"], rates["adamw"],
                              source))
    return out


@dataclass
class DefaultRates:
    """An arm's default peak rates per device (before --lr-scale-gpus), as a rates file holds them."""
    source: str                  # as the trainer's optimizer line names them
    adamw: float                 # AdamW's rate
    muon: float = None           # Muon's matrix rate (None: the trainer has no Muon)
    muon_other: float = None     # Muon's AdamW side


def read_rates(name, arm, directory=RATES_DIR):
    """The DefaultRates of `arm` in presets/rates/NAME.conf (san-paper: the SAN paper's locked
    rates; gpt2), which has per arm ARM-source, ARM-adamw and, for a trainer with Muon, ARM-muon
    and ARM-muon-other; checked as llmc/train/preset_files.h compiled_default_rates checks it."""
    path = os.path.join(directory, name + ".conf")
    arms = {}    # {arm: {field: (value, line)}}
    for key, value, line in read_conf(path):
        field = next((f for f in ("source", "muon-other", "muon", "adamw")
                      if key.endswith("-" + f) and len(key) > len(f) + 1), None)
        if field is None:
            raise PresetFileError(f"{path} line {line}: unknown key {key!r} (a rates file has ARM-source, ARM-muon, "
                                  f"ARM-muon-other, ARM-adamw)")
        fields_of_arm = arms.setdefault(key[:-len(field) - 1], {})
        if field in fields_of_arm:
            raise PresetFileError(f"{path} line {line}: {key} is set twice in the file")
        fields_of_arm[field] = (value, line)
    for a, f in arms.items():
        if "source" not in f or "adamw" not in f:
            raise PresetFileError(f"{path}: the arm {a} needs {a}-source and {a}-adamw")
        if ("muon" in f) != ("muon-other" in f):
            raise PresetFileError(f"{path}: the arm {a} has one of {a}-muon, {a}-muon-other without the other")
    if arm not in arms:
        raise PresetFileError(f"{path} has no rates for the arm {arm}")

    def number(field):
        if field not in arms[arm]:
            return None
        value, line = arms[arm][field]
        try:
            return float(value)
        except ValueError:
            raise PresetFileError(f"{path} line {line}: {arm}-{field} = {value!r} is not a number") from None
    return DefaultRates(arms[arm]["source"][0], number("adamw"), number("muon"), number("muon-other"))


def load_presets(directory=PRESET_DIR):
    """{name: Preset} of every NAME.conf in `directory` (presets/: train_san's; GPT2_PRESET_DIR: train_gpt2's)."""
    names = sorted(f for f in os.listdir(directory) if f.endswith(".conf"))
    return {n[:-len(".conf")]: read_preset(os.path.join(directory, n)) for n in names}


def read_recipe(name, directory=RECIPE_DIR):
    """[(key, value, line)] of presets/recipes/NAME.conf: train_san flags, PRESET.flag for one
    preset only, and the recipe's own keys (resume-keeps, paper-*-steps; train_san.cu apply_recipe)."""
    return read_conf(os.path.join(directory, name + ".conf"))


def flag_of_field(field_name):
    """A model field's flag without the --, as the trainers name it (the context is --max-seq-len)."""
    return "max-seq-len" if field_name == "seq_len" else field_name.replace("_", "-")


def model_config(preset, config_cls):
    """{field: value} of the dataclass `config_cls` from a Preset: every field from its flag's text, typed as
    the field; a field missing or a key that is no field fails naming the file."""
    by_flag = {flag_of_field(f.name): f for f in fields(config_cls)}
    unknown = sorted(set(preset.model) - set(by_flag))
    missing = sorted(set(by_flag) - set(preset.model))
    if unknown or missing:
        raise PresetFileError(f"{preset.path}: " + (f"unknown setting {unknown[0]!r}" if unknown else
                              f"sets no {missing[0]}: a preset sets every model flag"))
    out = {}
    for flag, f in by_flag.items():
        text = preset.model[flag]
        kind = {"bool": lambda v: bool(int(v)), "int": int, "float": float}.get(getattr(f.type, "__name__", f.type), str)
        try:
            out[f.name] = kind(text)
        except ValueError:
            raise PresetFileError(f"{preset.path}: {flag} = {text!r} is not a {f.type}") from None
    return out
