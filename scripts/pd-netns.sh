#!/usr/bin/env bash
# The prefill/decode self-test across two network namespaces on this machine (root only): a veth
# pair, prefill in kvl-pd-a at 10.77.0.1, decode in kvl-pd-b at 10.77.0.2, no shared loopback.
# The NIXL listener, the UCX TCP transfers, Mooncake's metadata store (in the prefill namespace)
# and its TCP transfers all cross the veth pair. Runs both engines; prints the self-test's JSON
# lines. Environment: KVLAYOUT_PY (the Python with kvlayout and the engine wheels; default
# target/py-venv/bin/python). Exit: 0 iff both self-tests exit 0; the namespaces are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${KVLAYOUT_PY:-target/py-venv/bin/python}"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
if [ "$(id -u)" -ne 0 ]; then
    echo "pd-netns: needs root (ip netns, veth)" >&2
    exit 2
fi
A=kvl-pd-a B=kvl-pd-b
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add "$A"
ip netns add "$B"
ip link add kvl-pd-va type veth peer name kvl-pd-vb
ip link set kvl-pd-va netns "$A"
ip link set kvl-pd-vb netns "$B"
ip -n "$A" addr add 10.77.0.1/24 dev kvl-pd-va
ip -n "$B" addr add 10.77.0.2/24 dev kvl-pd-vb
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set kvl-pd-va up
ip -n "$B" link set kvl-pd-vb up
echo "# namespaces: $A $(ip -n "$A" -br addr show kvl-pd-va | awk '{print $3}'), $B $(ip -n "$B" -br addr show kvl-pd-vb | awk '{print $3}')"
if command -v ping >/dev/null; then ip netns exec "$A" ping -c 1 -W 2 10.77.0.2 >/dev/null && echo "# $A -> $B ping ok"; fi
rc=0
for engine in nixl mooncake; do
    echo "# engine $engine"
    "$PY" -m kvlayout.pd selftest --engine "$engine" --repo "$PWD" \
        --prefill-addr 10.77.0.1 --decode-addr 10.77.0.2 \
        --prefill-prefix "ip netns exec $A" --decode-prefix "ip netns exec $B" || rc=1
done
exit "$rc"
