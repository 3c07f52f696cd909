"""gds's seam for device memory, where tests put a fake CUDA (tests/fake_kvikio.py): which
tensors are device memory, how device memory is handed to kvikio, which CUDA allocation holds a
tensor, and how device memory is allocated and filled on restore."""

from __future__ import annotations

import ctypes
from typing import Any

import torch


def on_device(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def cuda_array(mem: torch.Tensor) -> Any:
    """Device memory as kvikio takes it: a CUDA tensor has `__cuda_array_interface__`."""
    return mem


_libcuda: Any = None


def allocation_of(mem: torch.Tensor) -> tuple[int, int]:
    """(base address, bytes) of the CUDA allocation that holds `mem`'s first byte, as the
    driver reports it (cuMemGetAddressRange): the range kvikio's memory_register hands to
    cuFileBufRegister for any pointer inside it."""
    global _libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuMemGetAddressRange_v2
        fn.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]
        fn.restype = ctypes.c_int
        _libcuda = fn
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = _libcuda(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(mem.data_ptr()))
    if rc != 0:
        raise RuntimeError(f"cuMemGetAddressRange failed (CUresult {rc})")
    return base.value, size.value


def device_empty(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.to(device)


def kvikio_buffer(mem: torch.Tensor, device: bool) -> Any:
    """What kvikio gets for a flat uint8 tensor: device memory through `cuda_array`, host memory
    as a numpy array (kvikio takes the buffer protocol, which torch tensors lack: a torch CPU
    tensor would be a TypeError)."""
    return cuda_array(mem) if device else mem.numpy()
