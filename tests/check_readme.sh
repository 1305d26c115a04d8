#!/bin/sh
# The README's C example compiles against the built library and does what it says: the first
# ```c block of README.md is extracted, built with the public header alone, and run in a
# temporary directory; its first result must be the document its query was taken from.
set -e
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk '/^```c$/ {on = 1; next} /^```$/ && on {exit} on {print}' "$top_srcdir/README.md" > "$tmp/example.c"
if [ ! -s "$tmp/example.c" ]; then
    echo "README.md has no \`\`\`c block"
    exit 1
fi
libdir=$(cd "$top_builddir/.libs" && pwd)
${CC:-cc} -std=c11 -Wall -Wextra -Werror ${SAN_FLAGS:-} -I"$top_srcdir/engine" "$tmp/example.c" \
    -L"$libdir" -ltartan -o "$tmp/example"
cd "$tmp"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ./example > out.txt
cat out.txt
first=$(head -n 1 out.txt | cut -d' ' -f1)
if [ "$first" != doc7 ]; then
    echo "the example's best hit is '$first', not doc7"
    exit 1
fi
[ "$(wc -l < out.txt)" -eq 3 ] || { echo "expected 3 results"; exit 1; }
echo "README example: ok"
