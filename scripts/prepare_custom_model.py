#!/usr/bin/env python3
"""Prepares a second, differently shaped image classifier from the prepared bundled model.

`ai.model_dir` takes any ONNX image classifier its `manifest.json` describes; this script makes
one from the directory `scripts/prepare-model.sh` writes, so that the worker can be shown (and
tested) on a model other than the bundled one. Run it with the preparation's Python (the venv
`scripts/prepare-model.sh` sets up, with numpy, onnx and onnxruntime):

    ~/.cache/imagepipe/venv-prepare/bin/python scripts/prepare_custom_model.py \\
        --from .imagepipe/models --out /tmp/coarse-model [--size 160]

What it writes into `--out`:

- `model.onnx`: the bundled EfficientNet-Lite0 with its input renamed `pixels` and sized
  `[1,3,SIZE,SIZE]` (the network is convolutional with a global average pool, and its explicit
  "same" pads hold for any size divisible by 32), and a new head: the 1000 ImageNet logits are
  summed into the coarse classes of `COARSE_CLASSES` by log-sum-exp (each ImageNet class goes to
  the first coarse class among its name and its WordNet ancestors in the bundled `tags.json`,
  the rest to `other`), so the softmax of the output `scores` `[1,K]` is exactly each coarse
  class's share of the ImageNet probabilities. No features output, so no embedding.
- `labels.json`: the coarse class names, in output order. No `tags.json`: the worker then tags an
  image with its top classes' names.
- onnxruntime's shared library, copied from the bundled directory.
- `manifest.json`: model name, `input` (name, shape, per-channel mean and scale), `output` (name,
  shape), `files` with every file's sha256, `onnxruntime`.

The new head is checked before anything is written: on a few inputs, the softmax of `scores`
equals the coarse sums of the bundled head's softmax at the same size within 1e-5.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

# The preparation's own helpers (this script sits beside it).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_model import sha256_bytes, write_atomic  # noqa: E402

# The coarse classes, in output order: an ImageNet class belongs to the first of these that is
# its name or one of its WordNet ancestors; `OTHER` takes the classes none covers.
COARSE_CLASSES = [
    "dog",
    "cat",
    "bird",
    "fish",
    "insect",
    "food",
    "vehicle",
    "weapon",
    "clothing",
    "structure",
    "device",
    "container",
]
OTHER = "other"
# The network halves its input five times: a size divisible by 32 keeps the bundled graph's pads.
SIZE_STEP = 32
DEFAULT_SIZE = 160
INPUT_NAME = "pixels"
OUTPUT_NAME = "scores"
# The bundled graph's names (scripts/prepare_model.py).
BUNDLED_INPUT = "input"
BUNDLED_LOGITS = "logits"
MEAN, SCALE = 127.0, 128.0
TOLERANCE = 1e-5


class PrepareError(Exception):
    """The custom model could not be prepared; the message says why."""


def log(message: str) -> None:
    print(f"prepare-custom-model: {message}", file=sys.stderr, flush=True)


def read_bundled(source: Path) -> tuple[dict, bytes, list[str], list[list[str]]]:
    """The bundled directory's manifest, graph, labels and tag table, each checked against the
    manifest's sha256."""
    manifest = json.loads((source / "manifest.json").read_text())
    files = {}
    for name in ["model.onnx", "labels.json", "tags.json"]:
        data = (source / name).read_bytes()
        if sha256_bytes(data) != manifest["files"].get(name):
            raise PrepareError(f"{source / name} does not match {source / 'manifest.json'} (run scripts/prepare-model.sh)")
        files[name] = data
    return manifest, files["model.onnx"], json.loads(files["labels.json"]), json.loads(files["tags.json"])


def coarse_groups(labels: list[str], tags: list[list[str]]) -> tuple[list[str], np.ndarray]:
    """The coarse class names (`COARSE_CLASSES`, then `OTHER`) and the 1000×K 0/1 matrix
    putting each ImageNet class in its coarse class."""
    names = COARSE_CLASSES + [OTHER]
    matrix = np.zeros((len(labels), len(names)), dtype=np.float32)
    for i, (label, ancestors) in enumerate(zip(labels, tags)):
        own = {label, *ancestors}
        group = next((k for k, name in enumerate(COARSE_CLASSES) if name in own), len(COARSE_CLASSES))
        matrix[i, group] = 1.0
    empty = [names[k] for k in range(len(names)) if matrix[:, k].sum() == 0]
    if empty:
        raise PrepareError(f"no ImageNet class falls in {empty}")
    return names, matrix


def build(graph_bytes: bytes, size: int, matrix: np.ndarray):
    """The bundled graph with input `INPUT_NAME` [1,3,size,size] and the coarse head as
    `OUTPUT_NAME`; also the same graph with the ImageNet logits as a second output, for the
    check."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(graph_bytes)
    graph = model.graph
    (graph_input,) = [i for i in graph.input if i.name == BUNDLED_INPUT]
    graph_input.name = INPUT_NAME
    dims = graph_input.type.tensor_type.shape.dim
    dims[2].dim_value, dims[3].dim_value = size, size
    for node in graph.node:
        for j, name in enumerate(node.input):
            if name == BUNDLED_INPUT:
                node.input[j] = INPUT_NAME
    del graph.value_info[:]
    # log Σ_{i∈group} e^{l_i} = m + log Σ e^{l_i − m}, m the largest logit: no overflow.
    graph.initializer.append(numpy_helper.from_array(matrix, "coarse.groups"))
    graph.node.extend(
        [
            helper.make_node("ReduceMax", [BUNDLED_LOGITS], ["coarse.max"], name="coarse.max", axes=[1], keepdims=1),
            helper.make_node("Sub", [BUNDLED_LOGITS, "coarse.max"], ["coarse.shifted"], name="coarse.shift"),
            helper.make_node("Exp", ["coarse.shifted"], ["coarse.exp"], name="coarse.exp"),
            helper.make_node("MatMul", ["coarse.exp", "coarse.groups"], ["coarse.sums"], name="coarse.sum"),
            helper.make_node("Log", ["coarse.sums"], ["coarse.log"], name="coarse.log"),
            helper.make_node("Add", ["coarse.log", "coarse.max"], [OUTPUT_NAME], name="coarse.unshift"),
        ]
    )
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, matrix.shape[1]]))
    graph.name = "efficientnet-lite0-coarse"
    onnx.checker.check_model(model)
    checked = onnx.ModelProto()
    checked.CopyFrom(model)
    checked.graph.output.append(helper.make_tensor_value_info(BUNDLED_LOGITS, TensorProto.FLOAT, [1, 1000]))
    return model.SerializeToString(), checked.SerializeToString()


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def check(checked: bytes, size: int, matrix: np.ndarray) -> None:
    """The softmax of the coarse scores is the coarse sums of the ImageNet softmax."""
    import onnxruntime

    session = onnxruntime.InferenceSession(checked, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    grid = np.linspace(0.0, 255.0, size, dtype=np.float32)
    inputs = [
        np.zeros((1, 3, size, size), dtype=np.float32),
        np.broadcast_to((grid[None, None, :, None] + grid[None, None, None, :]) / 2, (1, 3, size, size)),
        rng.uniform(0.0, 255.0, (1, 3, size, size)).astype(np.float32),
    ]
    for x in inputs:
        x = np.ascontiguousarray((x - MEAN) / SCALE, dtype=np.float32)
        scores, logits = session.run([OUTPUT_NAME, BUNDLED_LOGITS], {INPUT_NAME: x})
        expected = softmax(logits[0].astype(np.float64)) @ matrix.astype(np.float64)
        diff = float(np.abs(softmax(scores[0].astype(np.float64)) - expected).max())
        if not diff <= TOLERANCE:
            raise PrepareError(f"the coarse head disagrees with the ImageNet head: max |Δp| = {diff}")


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link to `source` at `target` when both are on one file system, else a copy."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        os.chmod(target, 0o644)


def prepare(source: Path, out: Path, size: int) -> None:
    if size % SIZE_STEP != 0 or not 32 <= size <= 2048:
        raise PrepareError(f"--size {size}: a multiple of {SIZE_STEP} from 32 to 2048 is needed")
    manifest, graph_bytes, labels, tags = read_bundled(source)
    names, matrix = coarse_groups(labels, tags)
    model, checked = build(graph_bytes, size, matrix)
    check(checked, size, matrix)
    out.mkdir(parents=True, exist_ok=True)
    labels_json = (json.dumps(names, indent=0) + "\n").encode()
    write_atomic(out / "model.onnx", model)
    write_atomic(out / "labels.json", labels_json)
    files = {"model.onnx": sha256_bytes(model), "labels.json": sha256_bytes(labels_json)}
    entry = manifest.get("onnxruntime")
    if entry is not None:
        library = entry["library"]
        link_or_copy(source / library, out / library)
        files[library] = manifest["files"][library]
    base, _, version = manifest["model"].partition("@")
    written = {
        "model": f"{base.replace('-imagenet1k', '')}-coarse{len(names)}-{size}@{version}",
        "input": {"name": INPUT_NAME, "shape": [1, 3, size, size], "mean": [MEAN] * 3, "scale": [SCALE] * 3},
        "output": {"name": OUTPUT_NAME, "shape": [1, len(names)]},
        "files": files,
        **({"onnxruntime": entry} if entry is not None else {}),
        "source": {"from": manifest["model"], "head": "log-sum-exp of the ImageNet logits by coarse class"},
    }
    write_atomic(out / "manifest.json", (json.dumps(written, indent=1) + "\n").encode())
    counts = ", ".join(f"{name} {int(matrix[:, k].sum())}" for k, name in enumerate(names))
    log(f"wrote {written['model']} to {out}: input {INPUT_NAME} {written['input']['shape']}, classes ({counts})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="source", type=Path, required=True, help="the prepared bundled model directory")
    parser.add_argument("--out", type=Path, required=True, help="the directory to write (an ai.model_dir)")
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE, help=f"input side in pixels (default {DEFAULT_SIZE})")
    args = parser.parse_args()
    try:
        prepare(args.source.resolve(), args.out.resolve(), args.size)
    except (PrepareError, OSError, KeyError, ValueError) as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
