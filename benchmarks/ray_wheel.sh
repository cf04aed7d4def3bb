#!/usr/bin/env bash
# Ray for the GPU machine, small enough to carry with a device call (its wheel is ~79 MB; a call carries 64 MiB in
# all): downloads Ray's Python 3.12 x86_64 wheel and its core dependencies into ./.whl_ray (run from the project
# root; the folder is git-excluded) and repacks Ray without what `evaluate.executor=ray` never loads: the Java
# jars, the dashboard's web client and the libraries on top of Ray Core (RLlib, Serve, Data, Train, Tune, LLM).
# On the GPU machine: pip install --no-index --no-deps --target /tmp/site .whl_ray/*.whl (gpu_session.sh does).
set -euo pipefail
dest=.whl_ray
version=${RAY_VERSION:-2.60.0}
mkdir -p "$dest"
grep -qx '/.whl_ray/' .git/info/exclude 2>/dev/null || echo '/.whl_ray/' >> .git/info/exclude
dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$1" "$2" 2>&1 | grep -v '^WARNING: Location' || true
}
tmp=$(mktemp -d)
dl "$tmp" "ray==$version"
for spec in click filelock jsonschema jsonschema-specifications referencing rpds-py attrs "msgpack>=1,<2" protobuf \
    requests urllib3 idna certifi charset-normalizer; do
  dl "$dest" "$spec"
done
python3 - "$tmp"/ray-*.whl "$dest" <<'EOF'
import base64, hashlib, sys, zipfile
from pathlib import Path

src, dest = Path(sys.argv[1]), Path(sys.argv[2])
DROP = ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/serve/", "ray/data/", "ray/train/", "ray/tune/",
        "ray/llm/")
out = dest / src.name
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
    record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    rows = []
    for info in zin.infolist():
        if info.filename == record_name or info.filename.startswith(DROP):
            continue
        data = zin.read(info)
        zout.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{info.filename},sha256={digest},{len(data)}")
    rows.append(f"{record_name},,")
    zout.writestr(record_name, "\n".join(rows) + "\n")
print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB (from {src.stat().st_size / 2**20:.1f})")
EOF
rm -rf "$tmp"
ls -1 "$dest"
du -sh "$dest"
