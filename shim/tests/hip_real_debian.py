# Drives a real libamdhip64 (Debian's ROCm 5 build; no AMD GPU here) through ctypes: dlopen +
# dlsym as Python programs do. Prints each call's return code and which library each looked-up
# entry point lives in. Used by shim/tests/hip.rs.
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
def where(name):
    a = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    for l in open('/proc/self/maps'):
        r, *rest = l.split()
        lo, hi = (int(x, 16) for x in r.split('-'))
        if lo <= a < hi:
            return rest[-1].rsplit('/', 1)[-1] if len(rest) >= 5 else '?'
    return '?'
n = ctypes.c_int(-1)
print('count', lib.hipGetDeviceCount(ctypes.byref(n)), n.value, flush=True)
p = ctypes.c_void_p()
print('malloc', lib.hipMalloc(ctypes.byref(p), ctypes.c_size_t(256 << 20)), flush=True)
f, t = ctypes.c_size_t(), ctypes.c_size_t()
print('info', lib.hipMemGetInfo(ctypes.byref(f), ctypes.byref(t)), flush=True)
print('free', lib.hipFree(p), flush=True)
print('where', where('hipMalloc'), where('hipMemGetInfo'), where('hipGetDeviceCount'), flush=True)
