# Tagged 4 KiB overwrites (BlockRemoved + BlockStored each) for the whole run.
import os, sys, time
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("DFKV_LIB", os.path.join(root, "build", "libdfkv.so"))
sys.path.insert(0, os.path.join(root, "python"))
import dfkv
c = dfkv.Client(f"n1={sys.argv[1]}", namespace=b"churn")
end = time.time() + float(sys.argv[2]); i = 0
while time.time() < end:
    k = b"c%d" % (i % 256); c.put(k, b"v" * 4096)
    c.tag([dfkv.Tag(key=k, block_hashes=[i], model="bench", block_size=16)]); i += 1
print("churn ops", i, file=sys.stderr)
