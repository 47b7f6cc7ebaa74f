"""fp8scope's recorder for PyTorch training loops (needs torch; the rest of fp8scope does not).

    rec = fp8scope.torch.Recorder(model, out="runs/fp8", recipe="delayed", dump_every=50)
    for batch in data:
        loss = ...; loss.backward(); opt.step(); opt.zero_grad()
        rec.step(loss)
    rec.close()

See python/README.md and `Recorder`'s docstring.
"""

try:
    import torch as _torch  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fp8scope.torch needs PyTorch (pip install torch); the rest of fp8scope works without it") from e

from .cast import cast_fp8, dequantize_fp8, round_bf16  # noqa: E402,F401
from .recorder import Recorder  # noqa: E402,F401

__all__ = ["Recorder", "cast_fp8", "dequantize_fp8", "round_bf16"]
