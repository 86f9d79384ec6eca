"""Fetch, here (where a registry is reachable), the wheels that the GPU box lacks, for
``benchmarks/gpu_check.sh`` to install there into a scratch ``--target`` (it has no registry).

Which: every distribution that ``ttft-diag[test]`` needs (walked from this environment's
installed metadata), less what the box's image already holds (:data:`ON_DEVICE`, from the
device notes' package list of 2026-11-17) and less :data:`LEFT_OUT` (torch and the CUDA
libraries: the box has its own CUDA build; transformers: only the slow third-party tests use
it). Each at the version installed here, so the box runs what CI runs, as a CPython 3.12
manylinux x86-64 wheel (the box's interpreter), ``--no-deps``: the walk names them all.

Run: ``python benchmarks/gpu_check_wheels.py [--dest .whl] [--list]``. The destination
should be ignored by git (``.git/info/exclude``) and named in the device call's ``carry``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

#: the device image's packages (normalised names), as the device notes list them
ON_DEVICE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson
ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx
optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq
torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp nvidia-ml-py
""".split())
#: on the box, but carried anyway: opentelemetry-proto's generated code needs a protobuf runtime
#: at least as new as the one it was generated for (protobuf checks this at import)
CARRY_ANYWAY = frozenset({"protobuf"})
LEFT_OUT = ("torch", "transformers", "triton", "nvidia-*", "cuda-*")
#: pip's platform tags for the box (manylinux x86-64); pip matches each exactly
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _left_out(name: str) -> bool:
    return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in LEFT_OUT)


def project_requirements(extras: tuple[str, ...] = ("test",)) -> list[str]:
    """The project's own requirement lines, from pyproject.toml (the installed metadata of an
    editable install can be older than the file)."""
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [*doc["dependencies"], *(r for e in extras for r in doc.get("optional-dependencies", {}).get(e, []))]


def needed(extras: tuple[str, ...] = ("test",)) -> dict[str, str]:
    """{normalised name: version installed here} for the closure of the project's requirements."""
    seen: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = []
    for line in project_requirements(extras):
        req = Requirement(line)
        if (req.marker is None or req.marker.evaluate()) and not _left_out(norm(req.name)):
            todo.append((req.name, tuple(req.extras)))
    while todo:
        name, ex = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            print(f"warning: {name} is not installed here; not fetched", file=sys.stderr)
            continue
        key = norm(dist.metadata["Name"])
        if key in seen and not ex:
            continue
        seen[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            env_ok = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (*ex, ""))
            if env_ok and not _left_out(norm(req.name)) and (norm(req.name) not in seen or req.extras):
                todo.append((req.name, tuple(req.extras)))
    return {k: v for k, v in sorted(seen.items())
            if (k not in ON_DEVICE or k in CARRY_ANYWAY) and not _left_out(k)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=".whl", help="where the wheels go (default .whl)")
    ap.add_argument("--list", action="store_true", help="print NAME==VERSION and fetch nothing")
    a = ap.parse_args(argv)
    want = needed()
    if a.list:
        print("\n".join(f"{k}=={v}" for k, v in want.items()))
        return 0
    Path(a.dest).mkdir(parents=True, exist_ok=True)
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    failed = []
    for name, version in want.items():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *plat, "-d", a.dest, f"{name}=={version}"]
        if subprocess.run(cmd).returncode != 0:
            failed.append(f"{name}=={version}")
    total = sum(f.stat().st_size for f in Path(a.dest).glob("*.whl"))
    print(f"{len(want) - len(failed)} of {len(want)} wheels in {a.dest} ({total / 2**20:.1f} MiB)"
          + (f"; not found: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
