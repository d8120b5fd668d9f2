#!/usr/bin/env bash
# Exercises hccl-run with plain shell ranks: environment, tagged output,
# failures, timeout, signal forwarding and that nothing is left behind.
# Usage: launcher_test.sh PATH/TO/hccl-run
set -u

RUN=${1:?usage: launcher_test.sh PATH/TO/hccl-run}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hccl-launcher-test.XXXXXX") || exit 1
# Hung ranks run this link, so every process a case starts carries $tmp in
# its command line and "pgrep -f $tmp" finds exactly the leftovers.
SLEEP="$tmp/marker-sleep"
ln -s "$(command -v sleep)" "$SLEEP" || exit 1
passed=0
failed=0

cleanup() {
    local pids
    pids=$(pgrep -f -- "$tmp")
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

ok() {
    passed=$((passed + 1))
    echo "ok   - $1"
}

fail() {
    failed=$((failed + 1))
    echo "FAIL - $1 (launcher rc=$rc)"
    sed 's/^/    stdout: /' "$tmp/out" 2>/dev/null
    sed 's/^/    stderr: /' "$tmp/err" 2>/dev/null
}

# expect NAME COMMAND...: passes when COMMAND succeeds.
expect() {
    local name=$1
    shift
    if "$@"; then ok "$name"; else fail "$name"; fi
}

now() { date +%s.%N; }
# elapsed_below START SECONDS
elapsed_below() { awk -v s="$1" -v e="$(now)" -v m="$2" 'BEGIN { exit !(e - s < m) }'; }
no_leftovers() { ! pgrep -f -- "$tmp" >/dev/null; }
err_has() { grep -qE -- "$1" "$tmp/err"; }
out_has() { grep -qE -- "$1" "$tmp/out"; }

# launch ARGS...: runs the launcher, time-bounded, output in $tmp/out and $tmp/err.
launch() {
    timeout 30 "$RUN" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}

# Each rank prints what it was given; all must agree on the rendezvous.
env_is_right() {
    local n=$1 i line want ids secrets
    [ "$rc" -eq 0 ] && [ "$(wc -l <"$tmp/out")" -eq "$n" ] || return 1
    for ((i = 0; i < n; i++)); do
        line=$(grep -E "^rank=$i " "$tmp/out") || return 1
        want="^rank=$i r=$i lr=$i ws=$n lws=$n id=127\.0\.0\.1:[0-9]+ secret=[0-9a-f]{32} if=lo$"
        [[ $line =~ $want ]] || return 1
    done
    ids=$(sed -E 's/.* id=([^ ]*) .*/\1/' "$tmp/out" | sort -u | wc -l)
    secrets=$(sed -E 's/.* secret=([^ ]*) .*/\1/' "$tmp/out" | sort -u | wc -l)
    [ "$ids" -eq 1 ] && [ "$secrets" -eq 1 ]
}

report_env='echo "rank=$RANK_ID r=$RANK lr=$LOCAL_RANK ws=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE'
report_env+=' id=$HCCL_COMM_ID secret=$HCCL_COMM_SECRET if=$HCCL_SOCKET_IFNAME"'

launch -n 4 -- sh -c "$report_env"
expect "all ranks succeed with the right environment" env_is_right 4

HCCL_COMM_ID=127.0.0.1:5999 launch -n 2 sh -c 'echo "$HCCL_COMM_ID"'
expect "a preset HCCL_COMM_ID is kept" \
    test "$rc" -eq 0 -a "$(grep -c '^127\.0\.0\.1:5999$' "$tmp/out")" -eq 2

# Multi-host options: this launcher starts ranks 3 and 4 of a 5-rank job and
# passes on the rendezvous and secret it is given; no loopback is forced.
multi_env_right() {
    local i line want
    [ "$rc" -eq 0 ] && [ "$(wc -l <"$tmp/out")" -eq 2 ] || return 1
    for i in 0 1; do
        line=$(grep -E "^\[$((3 + i))\]: rank=$((3 + i)) " "$tmp/out") || return 1
        want="^\[$((3 + i))\]: rank=$((3 + i)) r=$((3 + i)) lr=$i ws=5 lws=2"
        want+=" id=10\.1\.2\.3:4567 secret=00ff00ff if=$"
        [[ $line =~ $want ]] || return 1
    done
}
HCCL_COMM_SECRET=00ff00ff launch -n 2 --world-size 5 --rank-offset 3 --comm-id 10.1.2.3:4567 \
    --tag-output sh -c "$report_env"
expect "--world-size, --rank-offset and --comm-id set the ranks' environment" multi_env_right

# HCCL_COMM_ID from the environment, first host of a 4-rank job: no secret
# made up (other hosts could not know it), and a warning says so.
multi_env_first_right() {
    local i
    [ "$rc" -eq 0 ] && [ "$(wc -l <"$tmp/out")" -eq 2 ] || return 1
    for i in 0 1; do
        grep -qxE "rank=$i r=$i lr=$i ws=4 lws=2 id=h0:29500 secret= if=" "$tmp/out" || return 1
    done
    err_has "HCCL_COMM_SECRET is not set"
}
HCCL_COMM_ID=h0:29500 launch -n 2 --world-size=4 sh -c "$report_env"
expect "--world-size with HCCL_COMM_ID from the environment" multi_env_first_right

bad_multi_usage() {
    launch -n 2 --rank-offset 2 sh -c true
    [ "$rc" -eq 2 ] && err_has "needs --world-size" || return 1
    launch -n 2 --world-size 3 --rank-offset 2 --comm-id h0:1 sh -c true
    [ "$rc" -eq 2 ] && err_has "do not fit" || return 1
    launch -n 2 --world-size 4 sh -c true
    [ "$rc" -eq 2 ] && err_has "needs.*--comm-id" || return 1
    launch -n 2 --comm-id no-port sh -c true
    [ "$rc" -eq 2 ] && err_has "wants HOST:PORT"
}
expect "bad multi-host options are usage errors" bad_multi_usage

tagged_right() {
    local i
    [ "$rc" -eq 0 ] || return 1
    for i in 0 1 2; do
        out_has "^\[$i\]: hello from $i$" && out_has "^\[$i\]: no newline $i$" &&
            err_has "^\[$i\]: warning from $i$" || return 1
    done
    ! grep -qvE '^\[[0-2]\]: ' "$tmp/out"
}
launch -n 3 --tag-output sh -c \
    'echo "hello from $RANK_ID"; echo "warning from $RANK_ID" >&2; printf "no newline $RANK_ID"'
expect "--tag-output prefixes every line" tagged_right

# --bind core: each rank on one CPU of the launcher's set, rank i on the i-th (modulo);
# --bind none leaves the set alone; anything else is a usage error.
cpus=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)
ncpus=$(nproc)
launch -n 3 --bind core sh -c 'echo "$RANK_ID $(awk "/^Cpus_allowed_list/ {print \$2}" /proc/self/status)"'
# The launcher's own CPU list ("0-1,4"), one CPU per word.
cpu_words() {
    local part
    for part in ${cpus//,/ }; do
        if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
    done
}
bound_right() {
    [ "$rc" -eq 0 ] || return 1
    local list r
    list=($(cpu_words))
    for r in 0 1 2; do
        out_has "^$r ${list[$((r % ${#list[@]}))]}\$" || return 1
    done
}
expect "--bind core puts rank i on the i-th CPU" bound_right
launch -n 2 --bind none sh -c 'awk "/^Cpus_allowed_list/ {print \$2}" /proc/self/status'
expect "--bind none leaves the CPU set alone" \
    eval '[ "$rc" -eq 0 ] && [ "$(grep -c -x -- "$cpus" "$tmp/out")" -eq 2 ]'
launch -n "$((ncpus + 1))" sh -c 'echo "$RANK_ID $(awk "/^Cpus_allowed_list/ {print \$2}" /proc/self/status)"'
spread_right() {
    [ "$rc" -eq 0 ] || return 1
    local list r
    list=($(cpu_words))
    for ((r = 0; r <= ncpus; r++)); do
        out_has "^$r ${list[$((r % ${#list[@]}))]}\$" || return 1
    done
}
expect "by default, ranks that outnumber the CPUs are spread over them round robin" spread_right
launch -n "$((ncpus + 1))" --bind auto sh -c 'awk "/^Cpus_allowed_list/ {print \$2}" /proc/self/status'
expect "--bind auto does not bind more ranks than CPUs" \
    eval '[ "$rc" -eq 0 ] && [ "$(grep -c -x -- "$cpus" "$tmp/out")" -eq "$((ncpus + 1))" ]'
launch -n 2 --bind socket sh -c true
expect "--bind socket is a usage error" eval '[ "$rc" -eq 2 ] && err_has "--bind wants"'

launch -n 3 sh -c '[ "$RANK_ID" = 2 ] && exit 3; exit 0'
expect "a rank exiting 3 is named" \
    eval '[ "$rc" -ne 0 ] && err_has "^hccl-run: rank 2 \(pid [0-9]+\) exited with status 3$"'

start=$(now)
HCCL_RUN_GRACE_S=0.5 launch -n 3 sh -c '[ "$RANK_ID" = 1 ] && exit 3; exec "$0" 1000' "$SLEEP"
expect "a failed rank ends the hung others after the grace period" \
    eval '[ "$rc" -eq 1 ] && err_has "rank 1 \(pid [0-9]+\) exited with status 3" &&
          elapsed_below "$start" 10 && no_leftovers'

launch -n 2 sh -c '[ "$RANK_ID" = 1 ] && kill -KILL $$; exit 0'
expect "a rank killed by SIGKILL is named with the signal" \
    eval '[ "$rc" -ne 0 ] &&
          err_has "^hccl-run: rank 1 \(pid [0-9]+\) killed by signal 9 \(Killed\)$"'

# Ranks ignore SIGTERM and leave a grandchild behind: only SIGKILL to the
# process group cleans this up.
start=$(now)
launch -n 4 --timeout 2 sh -c \
    '[ "$RANK_ID" = 0 ] && exit 0; trap "" TERM; "$0" 1000 & "$0" 1000' "$SLEEP"
expect "a hung job times out with 124 and leaves nothing behind" \
    eval '[ "$rc" -eq 124 ] && elapsed_below "$start" 10 &&
          err_has "^hccl-run: timeout after 2 s; ranks still running: 1,2,3$" && no_leftovers'

# wait_for_files PATTERN COUNT: the ranks report they are up (bounded, 10 s).
wait_for_files() {
    local i
    for ((i = 0; i < 200; i++)); do
        [ "$(compgen -G "$1" | wc -l)" -ge "$2" ] && return 0
        sleep 0.05
    done
    return 1
}

start=$(now)
timeout 30 "$RUN" -n 3 sh -c 'touch "$1/up.$RANK_ID"; "$0" 1000' "$SLEEP" "$tmp" \
    >"$tmp/out" 2>"$tmp/err" &
timeout_pid=$!
rc=none
if wait_for_files "$tmp/up.*" 3; then
    kill -TERM "$(pgrep -P "$timeout_pid")"
fi
wait "$timeout_pid"
rc=$?
expect "SIGTERM to the launcher ends all ranks" \
    eval '[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && elapsed_below "$start" 10 && no_leftovers'

launch -n 2 "$tmp/no-such-program"
expect "a missing program fails" \
    eval '[ "$rc" -ne 0 ] &&
          err_has "cannot execute $tmp/no-such-program: No such file or directory"'

launch sh -c true
expect "no -n is a usage error" eval '[ "$rc" -eq 2 ] && err_has "^usage: "'
launch -n 0 sh -c true
expect "-n 0 is a usage error" test "$rc" -eq 2
launch -n 2
expect "no program is a usage error" test "$rc" -eq 2
launch --help
expect "--help prints usage to stdout" eval '[ "$rc" -eq 0 ] && out_has "^usage: "'

expect "no process left behind by any case" no_leftovers

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
