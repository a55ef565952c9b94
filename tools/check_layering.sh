#!/usr/bin/env bash
# Checks that includes run only downwards between the project's folders
# (DESIGN.md section 1): shm/ knows nothing of kvrelay's instances, requests
# or messages; instance/ builds on shm/; schemas/ (the messages) on both;
# kernels/ knows nothing of rings; coordinator/, worker/ and client/ sit on
# top and never include each other. Prints every include that runs the wrong
# way and exits 1 if there is one. Run from anywhere; ctest runs it.
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
    client) echo "shm instance schemas client kvrelay" ;;
  esac
}

bad=0
for folder in shm instance schemas kernels coordinator worker client; do
  ok=" $(allowed "$folder") "
  while IFS=: read -r file line text; do
    target=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^/"]+)\/.*/\1/' <<<"$text")
    [ "$target" = "$text" ] && continue  # an include without a folder
    case "$ok" in *" $target "*) ;; *)
      echo "$file:$line: $folder/ includes $target/ ($text)"
      bad=1
      ;;
    esac
  done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+/' "$folder" \
             --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
done
if [ "$bad" -eq 0 ]; then echo "layering: every include runs downwards"; fi
exit "$bad"
