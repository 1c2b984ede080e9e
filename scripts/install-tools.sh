#!/usr/bin/env bash
# Install the external tools the test suite runs for real: kube-apiserver and etcd (built from Go modules, since
# there is no Docker and no release download here), helm (go install), prometheus + promtool (Debian package,
# unpacked, no service), and a check for kubectl (preinstalled).
#
# Idempotent: each tool lives in $ROLLOUT_FLEET_CACHE/tools/<name>-<version>/ (default ~/.cache/rollout-fleet) and a
# `.complete` stamp marks a finished install, so a warm run only checks stamps. Changing a pin in
# tools/versions.env selects a new directory, so the next run builds that version. Go module and build caches live
# under the same cache root, never in the checkout.
#
# Usage: bash scripts/install-tools.sh [-q] [TOOL...]
#   -q     print only failures
#   TOOL   any of kubectl prometheus etcd helm kube-apiserver (default: all)
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
[[ ${#WANT[@]} -gt 0 ]] || WANT=(kubectl prometheus etcd helm kube-apiserver)

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

# stamp DIR: a tool dir is usable only once its stamp exists (an interrupted build is redone, not reused).
installed() { [[ -f "$1/.complete" ]]; }

mkdir -p "$TOOLS"
T0=$SECONDS

# --- kube-apiserver -------------------------------------------------------------------------------------------
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io/* staging module with a local path.
# A generated wrapper module requires it and replaces each staging module with its published v0.X.Y twin.
build_kube_apiserver() {
  local dir="$TOOLS/kube-apiserver-$KUBERNETES_VERSION"
  installed "$dir" && { say "kube-apiserver $KUBERNETES_VERSION: cached"; return; }
  need go "install Go (https://go.dev) 1.25 or newer: kube-apiserver is built from source"
  say "kube-apiserver $KUBERNETES_VERSION: building (cold: ~10 min on 2 cores)"
  local work="$dir/src" staging v
  rm -rf "$dir"; mkdir -p "$work" "$dir/bin"
  run "$dir/download.log" go mod download "k8s.io/kubernetes@v$KUBERNETES_VERSION"
  local kmod
  kmod="$(go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')"
  [[ -f "$kmod" ]] || die "could not read go.mod of k8s.io/kubernetes@v$KUBERNETES_VERSION"
  staging="$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$kmod")"
  [[ -n "$staging" ]] || die "no staging replace directives found in $kmod"
  v="v0.${KUBERNETES_VERSION#1.}"
  {
    echo "module rolloutfleet.local/kube-apiserver"
    echo
    sed -n 's/^go \(.*\)/go \1/p' "$kmod"
    echo
    echo "require k8s.io/kubernetes v$KUBERNETES_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $v"; done
    echo ")"
  } >"$work/go.mod"
  cat >"$work/main.go" <<'GO'
// Command kube-apiserver: the upstream main (cmd/kube-apiserver/apiserver.go), built from published modules.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
GO
  (cd "$work" && run "$dir/tidy.log" go mod tidy)
  local major="${KUBERNETES_VERSION%%.*}" minor="${KUBERNETES_VERSION#*.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=v$KUBERNETES_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$work" && run "$dir/build.log" go build -trimpath -ldflags "$ld" -o "$dir/bin/kube-apiserver" .)
  "$dir/bin/kube-apiserver" --version | grep -q "v$KUBERNETES_VERSION" || die "built kube-apiserver reports a wrong version"
  touch "$dir/.complete"
  say "kube-apiserver $KUBERNETES_VERSION: built"
}

# --- etcd -----------------------------------------------------------------------------------------------------
# go.etcd.io/etcd/server/v3 has a main package and no replace directives, so plain `go install` works.
build_etcd() {
  local dir="$TOOLS/etcd-$ETCD_VERSION"
  installed "$dir" && { say "etcd $ETCD_VERSION: cached"; return; }
  need go "install Go (https://go.dev) 1.25 or newer: etcd is built from source"
  say "etcd $ETCD_VERSION: building"
  rm -rf "$dir"; mkdir -p "$dir/bin"
  GOBIN="$dir/gobin" run "$dir/build.log" go install -trimpath -ldflags "-s -w" "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  mv "$dir/gobin/server" "$dir/bin/etcd"; rmdir "$dir/gobin"
  "$dir/bin/etcd" --version | grep -q "$ETCD_VERSION" || die "built etcd reports a wrong version"
  touch "$dir/.complete"
  say "etcd $ETCD_VERSION: built"
}

# --- helm -----------------------------------------------------------------------------------------------------
build_helm() {
  local dir="$TOOLS/helm-$HELM_VERSION"
  installed "$dir" && { say "helm $HELM_VERSION: cached"; return; }
  need go "install Go (https://go.dev) 1.25 or newer: helm is built from source"
  say "helm $HELM_VERSION: building"
  rm -rf "$dir"; mkdir -p "$dir/bin"
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION"
  GOBIN="$dir/bin" run "$dir/build.log" go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  "$dir/bin/helm" version --short | grep -q "v$HELM_VERSION" || die "built helm reports a wrong version"
  touch "$dir/.complete"
  say "helm $HELM_VERSION: built"
}

# --- prometheus + promtool ------------------------------------------------------------------------------------
install_prometheus() {
  local dir="$TOOLS/prometheus-$PROMETHEUS_DEB_VERSION"
  installed "$dir" && { say "prometheus $PROMETHEUS_DEB_VERSION: cached"; return; }
  need apt-get "prometheus comes from Debian's package; on a non-Debian machine put prometheus and promtool in $dir/bin"
  need dpkg-deb "prometheus comes from Debian's package (dpkg-deb unpacks it)"
  say "prometheus $PROMETHEUS_DEB_VERSION: downloading the Debian package"
  rm -rf "$dir"; mkdir -p "$dir/deb" "$dir/bin"
  if ! (cd "$dir/deb" && apt-get download "prometheus=$PROMETHEUS_DEB_VERSION" >"$dir/download.log" 2>&1); then
    # The package lists may be missing or stale on a fresh machine: refresh once, then retry.
    run "$dir/apt-update.log" apt-get update
    (cd "$dir/deb" && run "$dir/download.log" apt-get download "prometheus=$PROMETHEUS_DEB_VERSION")
  fi
  run "$dir/unpack.log" dpkg-deb -x "$dir"/deb/prometheus_*.deb "$dir/root"
  ln -s ../root/usr/bin/prometheus "$dir/bin/prometheus"
  ln -s ../root/usr/bin/promtool "$dir/bin/promtool"
  rm -rf "$dir/deb"
  "$dir/bin/promtool" --version >/dev/null 2>&1 || die "unpacked promtool does not run"
  touch "$dir/.complete"
  say "prometheus $PROMETHEUS_DEB_VERSION: unpacked"
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
    prometheus) install_prometheus ;;
    etcd) build_etcd ;;
    helm) build_helm ;;
    kube-apiserver) build_kube_apiserver ;;
    *) die "unknown tool '$tool' (known: kubectl prometheus etcd helm kube-apiserver)" ;;
  esac
done
say "all tools ready in $TOOLS ($((SECONDS - T0)) s)"
