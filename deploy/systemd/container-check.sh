#!/bin/sh
# The install path on a fresh Debian host, with systemd as PID 1: a Debian bookworm
# root file system (debootstrap) booted in a systemd-nspawn container, where the
# check below runs as a boot service: pip install edgewatt (this checkout),
# `edgewatt install-service`, the notify/watchdog supervision (a daemon stopped with
# SIGSTOP must be restarted), `edgewatt doctor`, a registration, the unit's exposure
# level, `edgewatt uninstall-service`. Needs root, debootstrap and systemd-container
# (apt-get install debootstrap systemd-container) and ~300 MB of downloads; not run
# in CI for that reason. Set ROOTFS to reuse a root file system between runs.
#
#     sudo deploy/systemd/container-check.sh
set -eu
HERE=$(cd "$(dirname "$0")/../.." && pwd)
ROOTFS=${ROOTFS:-/var/lib/machines/edgewatt-check}
if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
    debootstrap --variant=minbase \
        --include=systemd,systemd-sysv,dbus,python3,python3-venv,ca-certificates \
        bookworm "$ROOTFS" http://deb.debian.org/debian
fi
rm -rf "$ROOTFS/src" "$ROOTFS/results" "$ROOTFS/opt/edgewatt" "$ROOTFS/usr/local/bin/edgewatt"
mkdir -p "$ROOTFS/src" "$ROOTFS/results"
(cd "$HERE" && git archive HEAD) | tar -x -C "$ROOTFS/src"
# The host's CA bundle: a TLS-inspecting proxy between this machine and PyPI.
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/host-ca.crt"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true

cat > "$ROOTFS/check.sh" <<'CHECK'
#!/bin/sh
exec > /results/log.txt 2>&1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/etc/ssl/certs/host-ca.crt
say() { echo "== $*"; }
python3 -m venv /opt/edgewatt && /opt/edgewatt/bin/pip install -q /src || { echo "FAIL pip"; systemctl poweroff; exit; }
ln -s /opt/edgewatt/bin/edgewatt /usr/local/bin/edgewatt
say install; edgewatt install-service
sleep 10
say unit; systemctl show edgewatt -p Type -p ActiveState -p SubState -p WatchdogUSec -p NRestarts -p StatusText -p User
say doctor; edgewatt doctor
sleep 300 & TARGET=$!
say register; /opt/edgewatt/bin/python -c "from edgewatt import client; r = client.register(pid=$TARGET, fallback='never'); print(r.mode)"
sleep 3
say status; edgewatt status; systemctl show edgewatt -p StatusText
say watchdog; kill -STOP "$(systemctl show -p MainPID --value edgewatt)"; sleep 40
systemctl show edgewatt -p ActiveState -p SubState -p NRestarts
journalctl -b -u edgewatt --no-pager | grep -E "Watchdog timeout|restart counter" || true
say security; systemd-analyze security edgewatt --no-pager | tail -1
say uninstall; edgewatt uninstall-service; echo "after uninstall: $(systemctl is-active edgewatt)"
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
TimeoutStartSec=900
[Install]
WantedBy=multi-user.target
UNIT
mkdir -p "$ROOTFS/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/edgewatt-check.service \
    "$ROOTFS/etc/systemd/system/multi-user.target.wants/edgewatt-check.service"

timeout 900 systemd-nspawn --register=no --keep-unit --quiet -b -D "$ROOTFS" >/dev/null 2>&1 || true
LOG="$ROOTFS/results/log.txt"
cat "$LOG"
fail=0
check() { grep -q -- "$1" "$LOG" || { echo "FAIL: expected '$1'"; fail=1; }; }
check "Type=notify"
check "ActiveState=active"
check "WatchdogUSec=30s"
check "^daemon$"
check "StatusText=1 target"
check "Watchdog timeout"
check "NRestarts=1"
check "after uninstall: inactive"
level=$(sed -n 's/.*Overall exposure level for edgewatt.service: \([0-9.]*\).*/\1/p' "$LOG")
awk -v l="${level:-99}" 'BEGIN { exit !(l <= 4.5) }' || { echo "FAIL: exposure ${level:-?} > 4.5"; fail=1; }
[ "$fail" = 0 ] && echo "container check passed (exposure $level)"
exit "$fail"
