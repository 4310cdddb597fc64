#!/usr/bin/env bash
# Re-vendor the portal's browser libraries from the npm registry, at their pinned versions:
#   Chart.js (served by the service, metering/web/static/vendor/) and axe-core (tests only,
#   tests/portal/vendor/). `npm pack` fetches the published tarball; only the built file and its
#   licence are kept. Bump a version here, run this, and update the paths that name it
#   (metering/portal/pages.py: CHART_JS; tests/portal/browser.py: AXE).
set -euo pipefail
cd "$(dirname "$0")/.."

CHART_JS_VERSION=4.5.1
AXE_CORE_VERSION=4.11.0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

unpack() {  # name version → $work/<name>/package
    (cd "$work" && npm pack --silent "$1@$2" >/dev/null)
    mkdir -p "$work/$1"
    tar xzf "$work/$1-$2.tgz" -C "$work/$1"
}

unpack chart.js "$CHART_JS_VERSION"
chart="metering/web/static/vendor/chart.js-$CHART_JS_VERSION"
rm -rf metering/web/static/vendor/chart.js-*
mkdir -p "$chart"
cp "$work/chart.js/package/dist/chart.umd.min.js" "$work/chart.js/package/LICENSE.md" "$chart/"

unpack axe-core "$AXE_CORE_VERSION"
axe="tests/portal/vendor/axe-core-$AXE_CORE_VERSION"
rm -rf tests/portal/vendor/axe-core-*
mkdir -p "$axe"
cp "$work/axe-core/package/axe.min.js" "$work/axe-core/package/LICENSE" \
   "$work/axe-core/package/LICENSE-3RD-PARTY.txt" "$axe/"

echo "vendored chart.js $CHART_JS_VERSION into $chart and axe-core $AXE_CORE_VERSION into $axe"
