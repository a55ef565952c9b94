#!/usr/bin/env bash
# Checks that includes run only downwards between the project's folders
# (DESIGN.md section 1): shm/ knows nothing of kvrelay's instances, requests
# or messages; instance/ builds on shm/; schemas/ (the messages) on both;
# kernels/ knows nothing of rings; coordinator/, worker/ and client/ sit on
# top and never include each other (client/ uses kernels/ to share an
# engine's GPU memory), except that the coordinator includes
# worker/transport_options.h, the flags it hands on to its workers, declared
# once by their owners. In worker/, net/ names no transport and the
# transports (ipc/, tcp/, rdma/) never include each other. Below them all
# sits the public vocabulary that engines and kvrelay's own code share
# (include/kvrelay/: result.h, deadline.h, types.h, pool_geometry.h), which
# includes nothing but itself and the standard library; client/include (the
# client itself) is for client/ only, and includes nothing but itself, the
# vocabulary and the standard library. Prints every include that runs the
# wrong way and exits 1 if there is one. Run from anywhere; ctest runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

allowed() {
  case "$1" in
    shm) echo "shm" ;;
    instance) echo "shm instance" ;;
    schemas) echo "shm instance schemas" ;;
    kernels) echo "shm kernels" ;;
    coordinator) echo "shm instance schemas coordinator" ;;
    worker) echo "shm instance schemas kernels worker" ;;
    client) echo "shm instance schemas kernels client kvrelay" ;;
  esac
}

vocabulary=" kvrelay/result.h kvrelay/deadline.h kvrelay/types.h kvrelay/pool_geometry.h "

bad=0
for folder in shm instance schemas kernels coordinator worker client; do
  ok=" $(allowed "$folder") "
  while IFS=: read -r file line text; do
    target=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^/"]+)\/.*/\1/' <<<"$text")
    [ "$target" = "$text" ] && continue  # an include without a folder
    header=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/' <<<"$text")
    case "$vocabulary" in *" $header "*) continue ;; esac
    [ "$folder" = coordinator ] && [ "$header" = worker/transport_options.h ] && continue
    case "$ok" in *" $target "*) ;; *)
      echo "$file:$line: $folder/ includes $target/ ($text)"
      bad=1
      ;;
    esac
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+/' "$folder" \
             --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
done
# The public headers: only each other and the standard library; the
# vocabulary only itself.
while IFS=: read -r file line text; do
  echo "$file:$line: a public header includes kvrelay's insides ($text)"
  bad=1
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' client/include include \
           | grep -vE '#[[:space:]]*include[[:space:]]+"kvrelay(/[a-z_]+)?\.h"' || true)
for header in include/kvrelay/*.h; do
  case "$vocabulary" in *" ${header#include/} "*) ;; *)
    echo "$header: not part of the vocabulary (add it to this script's list, or move it)"
    bad=1
    ;;
  esac
done
while IFS=: read -r file line text; do
  included=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/' <<<"$text")
  case "$vocabulary" in *" $included "*) continue ;; esac
  echo "$file:$line: the vocabulary includes something outside it ($text)"
  bad=1
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' include || true)
# The worker's network wing: worker/net/ (the connection layer every network
# transport shares) names no transport, and the transports are siblings that
# never include each other; the registry (worker/transport_registry.cpp) and
# the worker's own files above them are what name them all.
transport_dirs="ipc tcp rdma"
for dir in net $transport_dirs; do
  [ -d "worker/$dir" ] || continue
  for other in $transport_dirs; do
    [ "$other" = "$dir" ] && continue
    while IFS=: read -r file line text; do
      echo "$file:$line: worker/$dir/ includes the $other transport ($text)"
      bad=1
    done < <(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"worker/$other/" \
               "worker/$dir" || true)
  done
done
if [ "$bad" -eq 0 ]; then echo "layering: every include runs downwards"; fi
exit "$bad"
