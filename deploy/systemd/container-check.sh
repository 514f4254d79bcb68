#!/bin/sh
# The README's install paths on a fresh Debian host, with systemd as PID 1: a Debian
# trixie root file system (debootstrap) booted in a systemd-nspawn container, where
# the check below runs as a boot service. The checkout lies in a normal user's home
# (/home/alice/edgewatt), and the service is installed three ways, each checked end
# to end (active unit, alice's process seen in `edgewatt status` and on /metrics,
# uninstall):
#   venv         alice: python3 -m venv .venv && .venv/bin/pip install .
#                        sudo .venv/bin/edgewatt install-service
#   pipx         alice: pipx install ~/edgewatt; sudo ~/.local/bin/edgewatt install-service
#   pipx-global  sudo pipx install --global ~alice/edgewatt; sudo edgewatt install-service
# Once, with the venv: a systemd unit registered by name (its cgroup's figures), alice's
# `edgewatt run` without --cgroup under her own systemd manager (lingering): its command
# in a scope delegated to her, a 6 MB connection opened and closed between two passes
# counted exactly; the notify/watchdog supervision (a daemon stopped with SIGSTOP must
# be restarted) and the unit's exposure level.
#
# Needs root, debootstrap and systemd-container, and downloads (~300 MB of Debian
# packages, edgewatt's dependencies from PyPI): not run in CI. The Debian mirror is the
# host's own (its apt sources), or MIRROR. Set ROOTFS to reuse a root file system.
#
#     sudo deploy/systemd/container-check.sh
set -eu
HERE=$(cd "$(dirname "$0")/../.." && pwd)
ROOTFS=${ROOTFS:-/var/lib/machines/edgewatt-check}
if [ -z "${MIRROR:-}" ]; then
    # deb822 (URIs: ...) or one-line (deb URL suite ...) sources; the first Debian one.
    MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list.d/*.sources 2>/dev/null |
        sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' \
            -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' |
        grep -v -e security -e '^$' | head -n 1)
fi
[ -n "$MIRROR" ] || { echo "no Debian mirror in the apt sources: set MIRROR"; exit 2; }
if [ ! -x "$ROOTFS/usr/bin/pipx" ]; then
    debootstrap --variant=minbase \
        --include=systemd,systemd-sysv,dbus,libpam-systemd,nftables,python3,python3-venv,pipx,sudo,ca-certificates \
        trixie "$ROOTFS" "$MIRROR"
fi
# A root file system made before the user run's check: nftables counts a cgroup's
# bytes, libpam-systemd lets user@UID.service (a user's own manager) start.
if [ ! -x "$ROOTFS/usr/sbin/nft" ] || ! ls "$ROOTFS"/usr/lib/*/security/pam_systemd.so >/dev/null 2>&1; then
    systemd-nspawn --register=no --keep-unit --quiet -D "$ROOTFS" \
        apt-get install -y -q nftables libpam-systemd >/dev/null || true
fi
rm -rf "$ROOTFS/home/alice/edgewatt" "$ROOTFS/results" "$ROOTFS/opt/edgewatt" "$ROOTFS/opt/pipx"
mkdir -p "$ROOTFS/home/alice/edgewatt" "$ROOTFS/results"
(cd "$HERE" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -c) |
    tar -x -C "$ROOTFS/home/alice/edgewatt"
# The host's CA bundle, for every user's pip and pipx: a TLS-inspecting proxy may
# stand between this machine and PyPI.
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/host-ca.crt"
printf '[global]\ncert = /etc/ssl/certs/host-ca.crt\ndisable-pip-version-check = true\n' \
    > "$ROOTFS/etc/pip.conf"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
grep -q "$(hostname)" "$ROOTFS/etc/hosts" 2>/dev/null ||
    echo "127.0.1.1 $(hostname)" >> "$ROOTFS/etc/hosts"

cat > "$ROOTFS/check.sh" <<'CHECK'
#!/bin/sh
exec > /results/log.txt 2>&1
id alice >/dev/null 2>&1 || useradd -m -s /bin/sh alice
chown -R alice:alice /home/alice
echo "alice ALL=(ALL) NOPASSWD: ALL" > /etc/sudoers.d/alice
say() { echo "== $*"; }
# As alice, in a login shell without XDG_RUNTIME_DIR (no PAM session here).
as_alice() { su - alice -c "unset XDG_RUNTIME_DIR; $1"; }
TRAIN='import os, time; from edgewatt import client
r = client.register(labels={"run": "container"}); print("mode", r.mode, r.socket, flush=True)
time.sleep(12)'
METRICS='import urllib.request as u; t = u.urlopen("http://127.0.0.1:9464/metrics").read()
print(t.decode().count("run=\"container\""), "series of alice'"'"'s run on /metrics")'

prove() {  # $1: how it was installed; $2: the python that has edgewatt for alice
    sleep 5
    say "$1 unit"; systemctl show edgewatt -p ActiveState -p SubState -p ExecStart | tr '\n' ' '; echo
    as_alice "$2 -c '$TRAIN' > /tmp/train.out 2>&1 &"
    sleep 4
    say "$1 training"; cat /tmp/train.out
    say "$1 status"; as_alice "$3 status"
    say "$1 metrics"; python3 -c "$METRICS"
    say "$1 doctor"; as_alice "$3 doctor" | head -n 1
    say "$1 end"
    sleep 10  # the training script ends
}

say venv install
as_alice "cd ~/edgewatt && python3 -m venv .venv && .venv/bin/pip install -q ." || echo "FAIL pip"
cd /home/alice/edgewatt && sudo .venv/bin/edgewatt install-service; cd /
prove venv /home/alice/edgewatt/.venv/bin/python /home/alice/edgewatt/.venv/bin/edgewatt
say unit target  # a service registered by name: its cgroup measured whole
systemd-run --unit=edgewatt-demo /bin/sh -c \
    'i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; sleep 30'
sleep 3
EW=/home/alice/edgewatt/.venv/bin/edgewatt
id=$(sudo $EW register --unit edgewatt-demo.service) && sudo $EW summary "$id"
as_alice "$EW register --unit edgewatt-demo.service" || echo "(refused, as it must be: root's unit)"
systemctl stop edgewatt-demo
# alice's own systemd manager delegates a scope to her: `edgewatt run` without --cgroup
# puts its command in a cgroup there, and a connection opened and closed between two
# passes is counted whole (6 MB, exact against what the kernel says it sent).
say user run
uid=$(id -u alice)
loginctl enable-linger alice || true
systemctl start "user@$uid.service" || true
i=0; while [ ! -S "/run/user/$uid/systemd/private" ] && [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done
cat > /tmp/serve.py <<'PY'
import socket
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 47111))
listener.listen(1)
conn, _ = listener.accept()
got = 0
while chunk := conn.recv(65536):
    got += len(chunk)
print("server received", got, flush=True)
PY
cat > /tmp/short.py <<'PY'
import socket, struct, time
s = socket.create_connection(("127.0.0.1", 47111))
s.sendall(b"x" * 6_000_000)
s.shutdown(socket.SHUT_WR)
while s.recv(65536):
    pass
info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
print("kernel sent", *struct.unpack_from("QQ", info, 200), flush=True)  # bytes_sent, _retrans
s.close()
time.sleep(0.3)
PY
cat > /tmp/exact.py <<'PY'
import json, re, sys
ran, summary = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
sent, again = map(int, re.search(r"kernel sent (\d+) (\d+)", ran).groups())
counted = summary["network_transmit_bytes"]
packets = summary["cgroup"]["network_transmit_packets"]
headers = counted - sent
exact = sent == 6_000_000 + again and 40 * packets <= headers <= 80 * packets
print(f"user run: {counted} IP bytes in {packets} packets for {sent} bytes the kernel sent, "
      f"cgroup {summary['cgroup']['path']}: {'exact' if exact else 'WRONG'}")
PY
python3 /tmp/serve.py > /tmp/served.txt 2>&1 &
sleep 1
started=$(date +%s.%N)
as_alice "cd /tmp && $EW run --label check=userrun -- python3 /tmp/short.py" > /tmp/userrun.txt 2>&1
echo "user run took $(python3 -c "import time; print(round(time.time() - $started, 2))") s"
cat /tmp/userrun.txt
wait
cat /tmp/served.txt
as_alice "$EW summary check=userrun --json" > /tmp/usersummary.json
python3 /tmp/exact.py /tmp/userrun.txt /tmp/usersummary.json
as_alice "$EW doctor" | grep "edgewatt run"
say watchdog; kill -STOP "$(systemctl show -p MainPID --value edgewatt)"; sleep 40
systemctl show edgewatt -p ActiveState -p NRestarts | tr '\n' ' '; echo
journalctl -b -u edgewatt --no-pager | grep -E "Watchdog timeout|restart counter" || true
say security; systemd-analyze security edgewatt --no-pager | tail -1
say venv uninstall; sudo /home/alice/edgewatt/.venv/bin/edgewatt uninstall-service
echo "after uninstall: $(systemctl is-active edgewatt), /opt/edgewatt: $(ls -d /opt/edgewatt 2>&1 | cut -c1-40)"

say pipx install
as_alice "pipx install --force ~/edgewatt" || echo "FAIL pipx"
sudo /home/alice/.local/bin/edgewatt install-service
venv=$(dirname "$(readlink -f /home/alice/.local/bin/edgewatt)")
prove pipx "$venv/python" /home/alice/.local/bin/edgewatt
sudo /home/alice/.local/bin/edgewatt uninstall-service

say pipx-global install
sudo pipx install --global --force /home/alice/edgewatt || echo "FAIL pipx --global"
sudo edgewatt install-service
prove pipx-global /opt/pipx/venvs/edgewatt/bin/python /usr/local/bin/edgewatt
sudo edgewatt uninstall-service
say done
systemctl poweroff
CHECK
chmod +x "$ROOTFS/check.sh"
cat > "$ROOTFS/etc/systemd/system/edgewatt-check.service" <<'UNIT'
[Unit]
Description=edgewatt install check
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/check.sh
TimeoutStartSec=1200
[Install]
WantedBy=multi-user.target
UNIT
mkdir -p "$ROOTFS/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/edgewatt-check.service \
    "$ROOTFS/etc/systemd/system/multi-user.target.wants/edgewatt-check.service"

# CAP_NET_ADMIN: the container shares the host's network namespace, where nspawn
# withholds it; the unit's daemon needs it for its nftables counters (cgroup targets).
timeout 1300 systemd-nspawn --register=no --keep-unit --quiet -b --capability=CAP_NET_ADMIN \
    -D "$ROOTFS" >/dev/null 2>&1 || true
LOG="$ROOTFS/results/log.txt"
cat "$LOG"
fail=0
check() { grep -q -- "$1" "$LOG" || { echo "FAIL: expected '$1'"; fail=1; }; }
for how in venv pipx pipx-global; do
    sed -n "/^== $how unit/,/^== $how end/p" "$LOG" > "/tmp/edgewatt-check-$how.txt"
    part() { grep -q -- "$1" "/tmp/edgewatt-check-$how.txt" || { echo "FAIL $how: expected '$1'"; fail=1; }; }
    part "ActiveState=active SubState=running"
    part "mode daemon /run/edgewatt/edgewatt.sock"
    part "[1-9][0-9]* series of alice's run on /metrics"
    part "run=container"
    part "daemon answering at /run/edgewatt/edgewatt.sock (the system service): 1 targets"
done
for how in venv pipx; do
    grep -A1 "^== $how unit" "$LOG" | grep -q "ExecStart={ path=/opt/edgewatt/bin/python" ||
        { echo "FAIL $how: the unit does not run the copy in /opt/edgewatt"; fail=1; }
done
grep -A1 "^== pipx-global unit" "$LOG" | grep -q "ExecStart={ path=/usr/local/bin/edgewatt" ||
    { echo "FAIL pipx-global: the unit does not run pipx's own script"; fail=1; }
check "^server received 6000000$"
check "^ok    edgewatt run: its command gets a cgroup of its own"
check "^user run: .* cgroup /user.slice/user-[0-9]*.slice/user@[0-9]*.service/.*edgewatt-run-[0-9a-f-]*\.scope/run-[0-9]*: exact$"
check "), cgroup /user.slice/user-[0-9]*.slice/user@[0-9]*.service/"
grep -q "not a cgroup of its own" "$LOG" && { echo "FAIL: alice's run fell back"; fail=1; }
check "Watchdog timeout"
check "NRestarts=1"
check "after uninstall: inactive, /opt/edgewatt: ls: cannot access"
check "^== done"
level=$(sed -n 's/.*Overall exposure level for edgewatt.service: \([0-9.]*\).*/\1/p' "$LOG")
awk -v l="${level:-99}" 'BEGIN { exit !(l <= 4.5) }' || { echo "FAIL: exposure ${level:-?} > 4.5"; fail=1; }
[ "$fail" = 0 ] && echo "container check passed (exposure $level)"
exit "$fail"
