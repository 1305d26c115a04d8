#!/bin/bash
# The kernels of kernels/residual_axes_cuda.cu before (6b2d728) and after (292ac05) the
# pack_afrag helper, compiled for sm_90 at the same path (the anonymous namespace's mangled
# name depends on it), compared section by section: which kernels' machine code changed.
set -eu
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT; mkdir -p "$t/k"
for v in 6b2d728 292ac05; do
  git show $v:kernels/residual_axes_cuda.cu > "$t/k/residual_axes_cuda.cu"
  (cd "$t/k" && nvcc -std=c++17 -O3 -arch=sm_90 -cubin -I"$OLDPWD/kernels" -I"$OLDPWD" \
     -DTARTAN_HAVE_CUDA=1 residual_axes_cuda.cu -o "$t/$v.cubin")
done
python3 - "$t/6b2d728.cubin" "$t/292ac05.cubin" <<'PY'
import struct, subprocess, sys
def text_sections(p):
    b = open(p, 'rb').read()
    shoff, = struct.unpack_from('<Q', b, 0x28)
    size, num, strndx = struct.unpack_from('<HHH', b, 0x3A)
    hs = [struct.unpack_from('<IIQQQQIIQQ', b, shoff + i * size) for i in range(num)]
    strtab = b[hs[strndx][4]:hs[strndx][4] + hs[strndx][5]]
    name = lambda h: strtab[h[0]:strtab.index(b'\0', h[0])].decode()
    return {name(h)[6:]: b[h[4]:h[4] + h[5]] for h in hs if name(h).startswith('.text.')}
a, b = text_sections(sys.argv[1]), text_sections(sys.argv[2])
same = 0
for n in sorted(set(a) | set(b)):
    if a.get(n) == b.get(n):
        same += 1
        continue
    dm = subprocess.run(['c++filt'], input=n, capture_output=True, text=True).stdout.strip()
    print(f"differs: {dm} ({len(a.get(n, b''))} -> {len(b.get(n, b''))} bytes)")
print(f"kernels with the same machine code: {same} of {len(set(a) | set(b))}")
PY
