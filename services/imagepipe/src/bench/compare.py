"""imagepipe bench --compare: the same photos through Pillow's draft decode and through
onnxruntime, one thread, CPU time per image (time.process_time), as JSON on stdout.

Pillow does what the metadata stage does to pixels: a draft decode (JPEG DCT scaling) to the
largest derivative, that derivative as JPEG, the thumbnail as WebP. HEIC and AVIF, which Pillow
does not read, go through libheif's own heif-convert to a JPEG (the child's CPU time,
resource.getrusage). onnxruntime runs the same model.onnx on one intra-op thread with the model's
input size.
"""
import io
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime
import PIL
from PIL import Image

photos_dir, model_path, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
preview, thumbnail = int(sys.argv[4]), int(sys.argv[5])
listed = json.loads(sys.stdin.read())
files, heif_files = listed["pillow"], listed["heif"]


def percentiles(samples):
    if not samples:
        return None
    ordered = sorted(samples)
    rank = lambda q: ordered[max(1, min(len(ordered), int(-(-q * len(ordered) // 1)))) - 1]
    return {"p50Ms": rank(0.50), "p95Ms": rank(0.95), "p99Ms": rank(0.99)}


def draft(path, derivatives):
    """CPU ms to draft-decode `path` to the first size and write each (size, format)."""
    started = time.process_time()
    image = Image.open(path)
    image.draft("RGB", (derivatives[0][0], derivatives[0][0]))
    image = image.convert("RGB")
    for size, encoding, quality in derivatives:
        image.thumbnail((size, size), Image.Resampling.BICUBIC)
        if encoding:
            image.save(io.BytesIO(), encoding, quality=quality)
    return (time.process_time() - started) * 1e3


def children_cpu_ms():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1e3


def heif_convert(path, out):
    """CPU ms of `heif-convert -q 85 path out.jpg`, the child process's."""
    started = children_cpu_ms()
    subprocess.run(["heif-convert", "-q", "85", path, out], check=True, stdout=subprocess.DEVNULL)
    return children_cpu_ms() - started


def libheif_version():
    shown = subprocess.run(["heif-convert", "--version"], capture_output=True, text=True)
    found = re.search(r"\d+\.\d+\.\d+", shown.stdout + shown.stderr)
    return found.group(0) if found else "?"


options = onnxruntime.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
session = onnxruntime.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
shape = [d if isinstance(d, int) else 1 for d in session.get_inputs()[0].shape]
inputs = np.random.default_rng(7).uniform(-1, 1, shape).astype(np.float32)
session.run(None, {name: inputs})

drafts, smalls, inference = [], [], []
for _ in range(rounds):
    for file in files:
        path = f"{photos_dir}/{file}"
        drafts.append(draft(path, [(preview, "JPEG", 85), (thumbnail, "WEBP", 80)]))
        smalls.append(draft(path, [(thumbnail, None, None)]))
    for _ in range(max(len(files), 4)):
        started = time.process_time()
        session.run(None, {name: inputs})
        inference.append((time.process_time() - started) * 1e3)

converts, libheif = [], None
if heif_files and shutil.which("heif-convert"):
    libheif = libheif_version()
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "out.jpg")
        for file in heif_files:  # a round not counted: the files and libheif's plugins cached
            heif_convert(f"{photos_dir}/{file}", out)
        for _ in range(rounds):
            for file in heif_files:
                converts.append(heif_convert(f"{photos_dir}/{file}", out))

json.dump(
    {
        "pillow": PIL.__version__,
        "libheif": libheif,
        "heifConvertMs": percentiles(converts),
        "onnxruntime": onnxruntime.__version__,
        "pillowDraftDerivativesMs": percentiles(drafts),
        "pillowDraftThumbnailMs": percentiles(smalls),
        "onnxruntimeInferenceMs": percentiles(inference),
    },
    sys.stdout,
)
