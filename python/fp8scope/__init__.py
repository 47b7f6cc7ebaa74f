"""fp8scope for PyTorch: record a training loop into an fp8scope run directory that `fp8-analyze`
reads like a run of `fp8-capture`.

    import fp8scope.torch
    rec = fp8scope.torch.Recorder(model, out="runs/fp8", recipe="delayed")
    ...
    rec.step(loss)          # after each optimizer step

The package itself needs numpy and pyarrow only: the FP8 casts (`fp8scope.fp8`), the reference
statistics (`fp8scope.stats`), the scaling recipes (`fp8scope.recipe`) and the run writer
(`fp8scope.writer`) work without torch; `fp8scope.torch` needs torch.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # `import fp8scope` then `fp8scope.torch.Recorder(...)`: import the torch part on first use, so
    # that the package imports where torch is not installed.
    if name == "torch":
        import importlib

        return importlib.import_module("fp8scope.torch")
    raise AttributeError(f"module 'fp8scope' has no attribute '{name}'")
