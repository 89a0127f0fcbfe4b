#!/bin/bash
# cuda-jit-layout.sh CUDA_HOME [LIBRARY_DIR...]
#
# Gives a CUDA toolkit installed from NVIDIA's pip wheels the layout JIT builders link against.
# FlashInfer links every JIT module with `-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda`
# (flashinfer-python 0.7.2 wheel: flashinfer/jit/cpp_ext.py:273-279), and nvcc itself adds the same two
# folders (the nvidia-cuda-nvcc 13.1.80 wheel: nvidia/cu13/bin/nvcc.profile, LIBRARIES). The wheels put
# their libraries in CUDA_HOME/lib, versioned only (libcudart.so.13), and no wheel ships a libcuda stub.
#
# 1. CUDA_HOME/lib64: a link to every library of CUDA_HOME/lib and of each LIBRARY_DIR (the venv's
#    nvidia/cu13/lib: cuBLAS, cuFFT... that torch brought), plus the unversioned development link of
#    each shared one (libcudart.so -> libcudart.so.13). The toolkit's own lib comes first: its libcudart
#    is the release of its headers; a LIBRARY_DIR only adds the names the toolkit lacks.
# 2. CUDA_HOME/lib64/stubs/libcuda.so: a link stub (SONAME libcuda.so.1) with one function per
#    driver-API function that CUDA_HOME/include/cuda.h declares, under the names cuda.h maps them to
#    (cuCtxCreate -> cuCtxCreate_v4, and the per-thread-stream _ptds/_ptsz names). Each returns 34,
#    CUDA_ERROR_STUB_LIBRARY, as NVIDIA's own stub does. It is for the linker only: the running
#    module must get the driver's libcuda.so.1, which the NVIDIA container toolkit mounts on a GPU host.
# 3. The loader finds CUDA_HOME/lib64 (/etc/ld.so.conf.d + ldconfig, as NVIDIA's CUDA images register
#    their toolkit's lib64), so a linked module's libcudart.so.13 resolves in any process, not only in
#    one where torch loaded its own first. The stubs folder is never registered (ldconfig does not
#    descend into it, and this script checks): a stub in the loader's cache would shadow the driver.
#
# Fails, naming what is missing, when the toolkit has no libcudart or cuda.h yields no driver API:
# a JIT module must never be linked against nothing.
set -euo pipefail

fail() {
    echo "cuda-jit-layout: $*" >&2
    exit 1
}

[ "$#" -ge 1 ] || fail "usage: cuda-jit-layout.sh CUDA_HOME [LIBRARY_DIR...]"
cuda_home=$1
shift
lib64=$cuda_home/lib64
header=$cuda_home/include/cuda.h
[ -d "$cuda_home/lib" ] || fail "$cuda_home/lib is missing: no toolkit libraries to link against"
mkdir -p "$lib64/stubs"

# ---- 1. lib64: links to the libraries, first folder wins, and the development links.
for dir in "$cuda_home/lib" "$@"; do
    [ -d "$dir" ] || continue   # a CPU torch brings no CUDA libraries
    for file in "$dir"/lib*.so.* "$dir"/lib*.a; do
        [ -f "$file" ] || continue
        name=${file##*/}
        [ -e "$lib64/$name" ] || ln -s "$file" "$lib64/$name"
        case $name in
            *.so.*)   # libfoo.so.13 sorts before libfoo.so.13.0: the shortest version names the link
                development=${name%%.so.*}.so
                [ -e "$lib64/$development" ] || ln -s "$name" "$lib64/$development" ;;
        esac
    done
done
[ -e "$lib64/libcudart.so" ] || fail "no libcudart.so.N in $cuda_home/lib (the nvidia-cuda-runtime wheel ships it)"

# ---- 2. The libcuda link stub, from the toolkit's own cuda.h.
[ -f "$header" ] || fail "$header is missing: no driver API to make the libcuda link stub from" \
                         "(the nvidia-cuda-runtime wheel ships it)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for flags in "" "-DCUDA_API_PER_THREAD_DEFAULT_STREAM"; do
    # shellcheck disable=SC2086  # $flags is one option or none
    gcc -E -P -x c $flags "$header" > "$work/cuda.i" || fail "gcc cannot preprocess $header"
    # A declaration may span lines: join them, then take every `CUresult cuName(`.
    tr '\n' ' ' < "$work/cuda.i" | { grep -oE '\bCUresult +cu[A-Za-z0-9_]+ *\(' || true; } \
        | sed -E 's/^CUresult +//; s/ *\($//' >> "$work/symbols"
done
sort -u -o "$work/symbols" "$work/symbols"
grep -qx cuInit "$work/symbols" || fail "$header declares no driver API function (no cuInit among" \
                                        "$(wc -l < "$work/symbols") names): cannot make the libcuda link stub"
{
    echo "/* libcuda link stub made from $header: link time only, never loaded. */"
    while read -r symbol; do
        echo "int $symbol(void) { return 34; }"   # CUDA_ERROR_STUB_LIBRARY
    done < "$work/symbols"
} > "$work/libcuda-stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$lib64/stubs/libcuda.so" "$work/libcuda-stub.c"
echo "libcuda link stub: $(wc -l < "$work/symbols") driver-API functions from $header" \
     "in $lib64/stubs/libcuda.so ($(readelf -d "$lib64/stubs/libcuda.so" | grep -o 'SONAME.*'))"

# ---- 3. The loader finds lib64, never the stub.
echo "$lib64" > /etc/ld.so.conf.d/000-stackforge-cuda-wheels.conf
ldconfig
if ldconfig -p | grep -F "$lib64/stubs"; then
    fail "the loader's cache lists the libcuda link stub; it would shadow the driver's libcuda.so.1"
fi
ldconfig -p | grep -F "$lib64/libcudart.so" \
    || fail "the loader's cache does not list $lib64/libcudart.so.N after ldconfig"
