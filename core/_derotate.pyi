"""Type stub of the compiled de-rotation kernel (core/_derotate.c; see kvscope.core.derotate_kernel)."""

MAX_BLOCK: int
KERNEL: str | None

def stats(kind: int, data: object, block: int, /) -> tuple[bool, float, float, float, float, int]: ...
