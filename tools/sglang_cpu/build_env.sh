#!/usr/bin/env bash
# Build the lean CPU environment for SGLang 0.5.23 in .venvs/sglang-cpu (idempotent, cached).
#
#   tools/sglang_cpu/build_env.sh            build or reuse
#   FORCE=1 tools/sglang_cpu/build_env.sh    rebuild the dependencies from scratch
#
# The dependency layer is rebuilt only when requirements.txt, constraints.txt or DEPS_REV below
# change (stamp .venvs/sglang-cpu/.deps-<hash>); the two CPU shims (cpu_shims.py,
# vllm_custom_ops.py) are copied in on every run when they differ; topas itself is reinstalled
# (editable) when pyproject.toml changes; sglang-router (router-requirements.txt, for
# make test-cluster) when that file changes. `.ready` is created once `import sglang`
# works in the venv. Also writes the tiny dummy-weight model (make_tiny_model.py).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${SGLANG_CPU_VENV:-$root/.venvs/sglang-cpu}"
py="${PY:-python3}"
SGLANG_VERSION=0.5.23
DEPS_REV=1  # bump when the install commands of the dependency layer change

hash_of() { cat "$@" | sha256sum | cut -c1-16; }
deps_hash="$( (echo "$SGLANG_VERSION $DEPS_REV"; cat "$here/requirements.txt" "$here/constraints.txt") | sha256sum | cut -c1-16)"
topas_hash="$(hash_of "$root/pyproject.toml")"
deps_stamp="$venv/.deps-$deps_hash"
topas_stamp="$venv/.topas-$topas_hash"
t0=$(date +%s)

if [[ "${FORCE:-0}" == 1 || ! -f "$deps_stamp" ]]; then
    echo "[sglang-cpu] building the dependency layer in $venv"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    vpy="$venv/bin/python"
    pipi() { "$vpy" -m pip install --disable-pip-version-check -q -c "$here/constraints.txt" "$@"; }
    # torch first: the CPU build on disk (pip finds it; a plain `torch` would take a CUDA build)
    pipi torch==2.13.0
    pipi --no-deps "sglang==$SGLANG_VERSION" triton torchvision==0.28.0
    pipi -r "$here/requirements.txt"
    rm -f "$venv"/.topas-*
    touch "$deps_stamp"
fi

# the CPU shims (cheap; copied when they differ)
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
install_file() { cmp -s "$1" "$2" || { mkdir -p "$(dirname "$2")"; cp "$1" "$2"; }; }
install_file "$here/cpu_shims.py" "$site/topas_sglang_cpu_shims.py"
echo "import topas_sglang_cpu_shims" > "$site/topas_sglang_cpu_shims.pth.new"
install_file "$site/topas_sglang_cpu_shims.pth.new" "$site/topas_sglang_cpu_shims.pth"
rm -f "$site/topas_sglang_cpu_shims.pth.new"
echo '"""Stub (topas CPU env, tools/sglang_cpu/build_env.sh): lets sglang import vllm._custom_ops."""' > "$site/vllm.init.new"
install_file "$site/vllm.init.new" "$site/vllm/__init__.py"
rm -f "$site/vllm.init.new"
install_file "$here/vllm_custom_ops.py" "$site/vllm/_custom_ops.py"

if [[ ! -f "$topas_stamp" ]]; then
    echo "[sglang-cpu] installing topas (editable) into $venv"
    # not the `sglang` extra: its sglang requirement would make pip resolve sglang's GPU dependencies
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -c "$here/constraints.txt" -e "$root[test]" "aiohttp>=3.9"
    rm -f "$venv"/.topas-*
    touch "$topas_stamp"
fi

# the router layer (make test-cluster): sglang-router, pinned in router-requirements.txt; its own
# stamp, so adding it did not rebuild the dependency layer above
router_stamp="$venv/.router-$(hash_of "$here/router-requirements.txt")"
if [[ ! -f "$router_stamp" ]]; then
    echo "[sglang-cpu] installing the router layer (router-requirements.txt)"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -c "$here/constraints.txt" -r "$here/router-requirements.txt"
    rm -f "$venv"/.router-*
    touch "$router_stamp"
fi

"$venv/bin/python" "$here/make_tiny_model.py" "$venv/tiny-llama" >/dev/null
if [[ ! -f "$venv/.ready" ]]; then
    "$venv/bin/python" -c 'import sglang, sglang.srt.managers.scheduler, torch; print("[sglang-cpu] sglang", sglang.__version__, "torch", torch.__version__)'
    touch "$venv/.ready"
fi
echo "[sglang-cpu] ready in $(( $(date +%s) - t0 )) s: $venv"
