#!/usr/bin/env bash
# The layer rule of docs/design.md ("Layers"), checked on every `#include "..."`:
#
#   base <- reactor <- links <- sched <- algos <- core <- the API
#
# A file under src/<layer>/ may include include/hccl.h and headers of its own layer or of a
# layer below it, never above. A private header is its directory's own: one named *_impl.h,
# or one in a layer's subfolder (src/links/shm/shm.h), is included only from that directory.
# Programs in tools/ and examples/ use the public API only: include/hccl.h (tools may also
# include their own headers in tools/).
#
# Usage: tools/check-layers.sh [repository root]   (default: the root this script lies in)
# Prints file:line and why for each forbidden include; exits 1 if there is any, 0 if none.
set -u

root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root" || exit 2

# Includes that break the rule today and need a real redesign, not a move. One line each:
# "file include" then " # " and why. An entry that no longer matches anything fails the check,
# so that the list only shrinks.
allowlist=$(cat <<'EOF'
tools/hccl-topo.c core/comm.h # prints the communicator's cards, links and tuner model: no public query gives them yet
EOF
)

layer_names=(base reactor links sched algos core)
declare -A layer_rank
for i in "${!layer_names[@]}"; do
    layer_rank[${layer_names[$i]}]=$i
done

fail=0

declare -A allowed
while IFS= read -r entry; do
    [ -n "$entry" ] && allowed[${entry%% #*}]=1
done <<<"$allowlist"
declare -A used

report() { # file line include why
    local key="$1 $3"
    if [ -n "${allowed[$key]:-}" ]; then
        used[$key]=1
        return
    fi
    echo "$1:$2: #include \"$3\": $4"
    fail=1
}

includes() { # every `#include "..."` under the given folders, as file:line:text
    grep -rn --include='*.c' --include='*.h' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$@" |
        sort -t: -k1,1 -k2,2n
}

# src/: by layer.
while IFS= read -r file; do
    layer=${file#src/}
    layer=${layer%%/*}
    if [ -z "${layer_rank[$layer]:-}" ]; then
        echo "$file: in src/$layer/, which is no layer (${layer_names[*]})"
        fail=1
    fi
done < <(find src -name '*.[ch]' | sort)
while IFS=: read -r file line inc; do
    rel=${file#src/}
    dir=${rel%/*}                   # e.g. links/shm
    layer=${rel%%/*}                # e.g. links
    rank=${layer_rank[$layer]:-}
    [ -z "$rank" ] && continue      # reported above
    inc=${inc#*\"}
    inc=${inc%%\"*}
    [ "$inc" = hccl.h ] && continue
    case $inc in
    */*) ;;
    *) inc="$dir/$inc" ;; # a bare name is its own directory's
    esac
    ilayer=${inc%%/*}
    irank=${layer_rank[$ilayer]:--1}
    idir=${inc%/*}
    if [ "$irank" -lt 0 ] || [ ! -f "src/$inc" ]; then
        report "$file" "$line" "$inc" "not a header of src/ (layers: ${layer_names[*]})"
    elif [ "$irank" -gt "$rank" ]; then
        report "$file" "$line" "$inc" "$layer may not include $ilayer (a higher layer)"
    elif [[ $inc == *_impl.h || $idir == */* ]] && [ "$idir" != "$dir" ]; then
        report "$file" "$line" "$inc" "private to src/$idir/"
    fi
done < <(includes src)

# tools/ and examples/: the public API only.
while IFS=: read -r file line inc; do
    dir=${file%/*}
    inc=${inc#*\"}
    inc=${inc%%\"*}
    [ "$inc" = hccl.h ] && continue
    if [[ $file == tools/* && $inc != */* && -f $dir/$inc ]]; then
        continue # the tool's own header
    fi
    report "$file" "$line" "$inc" "tools and examples use only include/hccl.h"
done < <(includes tools examples)

# Stale allowlist entries.
for key in "${!allowed[@]}"; do
    if [ -z "${used[$key]:-}" ]; then
        echo "check-layers.sh: allowlist entry '$key' matches nothing: remove it"
        fail=1
    fi
done

if [ "$fail" -ne 0 ]; then
    echo "check-layers.sh: forbidden includes (docs/design.md, Layers)"
    exit 1
fi
exit 0
