#!/usr/bin/env python3
"""Record the exact requests libdfkv sends for GETs of keys NS-00000000 .. NS-(N-1), for
lean_dfkv_client.py to replay (BENCHMARKS, "C ABI, part 3"). Run under strace:

  DFKV_LIB=build/libdfkv.so strace -f -qq -e trace=sendmsg -e signal=none -xx -s 256 \
      -o cap.trace python3 docs/bench/capture_requests.py get HOST:PORT NS 384
  python3 docs/bench/capture_requests.py parse cap.trace reqs.pkl

The keys must be stored (seed them with python/bench/cabi_compare.py --seed-only --ns NS).
The first sendmsg of the connection is the hello; each one after it is one GET prefix.
"""
import pickle
import re
import sys

if sys.argv[1] == "get":
    sys.path.insert(0, "python")
    import dfkv

    addr, ns, n = sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
    c = dfkv.Client("n1=" + addr, namespace=ns)
    buf = bytearray(1 << 20)
    for i in range(n):
        assert c.get_into(b"%s-%08d" % (ns, i), buf), i
    c.close()
else:
    hello, reqs = None, []
    for line in open(sys.argv[2]):
        if "sendmsg(" not in line:
            continue
        data = b"".join(bytes(int(h, 16) for h in re.findall(r"\\x([0-9a-f]{2})", base))
                        for base in re.findall(r'iov_base="((?:\\x[0-9a-f]{2})*)"', line))
        if hello is None:
            hello = data
        else:
            reqs.append(data)
    pickle.dump((hello, reqs), open(sys.argv[3], "wb"))
    print("hello %d bytes, %d requests" % (len(hello), len(reqs)))
