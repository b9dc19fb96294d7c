#!/usr/bin/env bash
# Run a command with the background drafter campaign stopped, and let the campaign go on when the last such command
# ends (on 2 cores a background job skews every timing and slows tests tenfold). Several holders may overlap: each
# takes a shared lock, and only the one that finds no other holder left continues the campaign (so does
# gumiho.bench.machine.campaign_paused, which `python -m gumiho bench` uses).
#
#   bash scripts/campaign_hold.sh make test
set -uo pipefail
RUNS=${RUNS:-"$(dirname "$0")/../runs/campaign"}
pid_file="$RUNS/campaign.pid"
if [ ! -s "$pid_file" ]; then exec "$@"; fi
group=$(cat "$pid_file")
exec 8>"$RUNS/hold.lock"
flock -s 8
kill -STOP -- "-$group" 2>/dev/null && echo "campaign_hold: paused the drafter campaign (process group $group)" >&2
"$@"
status=$?
flock -u 8
exec 8>&-
exec 7>"$RUNS/hold.lock"
if flock -n -x 7; then
    kill -CONT -- "-$group" 2>/dev/null && echo "campaign_hold: the drafter campaign goes on" >&2
fi
exit $status
