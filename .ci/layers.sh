#!/usr/bin/env bash
# The library's rooms (the top-level modules of src/) stand on floors, and a
# room imports only rooms on floors below its own: a lower room that names a
# higher one, or one on its own floor, fails the check with file:line. So
# does any room missing from the list below, and any two files of src/ that
# import each other.
#
# What counts as naming a room: every `crate::ROOM` path (and `super::`
# paths that climb to one), in `use` lines, in code and in comments and doc
# links alike. Doc links to public items go through the crate root
# (`crate::Cache`), which is allowed in comments; in code, a path through
# the root (`crate::Redlock`) fails, since it hides which room it reaches.
#
# What counts as a file importing another, for the circles: the paths above
# in code (not comments) and, in `use` lines, paths relative to the module
# (`use value::Value` in a mod.rs), each taken to the deepest file it
# names. What a file takes from its own parents' mod.rs is not counted: a
# parent declares its files, so that tie is there anyway.
set -euo pipefail
cd "$(dirname "$0")/.."

# Top floor first. Rooms on one floor import none of each other.
floors=(
    "inspect"
    "http"
    "engine"
    "lock"
    "store"
    "entry hot"
    "key error metrics"
)

floor_list=""
for i in "${!floors[@]}"; do
    for room in ${floors[$i]}; do
        floor_list+="$room=$i "
    done
done

files=$(find src -name '*.rs' ! -path src/lib.rs | sort)

status=0
for room in $(printf '%s\n' $files | sed 's|^src/||; s|[/.].*||' | sort -u); do
    case " $floor_list" in
    *" $room="*) ;;
    *)
        echo "layers: src/$room: room $room has no floor in .ci/layers.sh" >&2
        status=1
        ;;
    esac
done

awk -v floor_list="$floor_list" -v file_list="$files" '
function fail(msg) {
    if (msg in said) return
    said[msg] = 1
    print "layers: " msg > "/dev/stderr"
    failed = 1
}
# The module path of a file: src/a/b/mod.rs and src/a/b.rs are both a::b.
function module_of(path,    m) {
    m = path
    sub(/^src\//, "", m)
    sub(/\.rs$/, "", m)
    sub(/\/mod$/, "", m)
    gsub(/\//, "::", m)
    return m
}
# The absolute module path that `path` (crate::…, super::…, self::…, or a
# child of `base`) names, seen from module `base`; "" when it is not ours.
function absolute(path, base, relative,    n, s, i, out, start, b) {
    n = split(path, s, "::")
    b = base
    if (s[1] == "crate") {
        out = ""; start = 2
    } else if (s[1] == "self" || s[1] == "super") {
        start = 1
        while (start <= n && (s[start] == "self" || s[start] == "super")) {
            if (s[start] == "super") {
                if (b == "") return ""
                if (b ~ /::/) sub(/::[^:]*$/, "", b); else b = ""
            }
            start++
        }
        out = b
    } else if (relative && ((base "::" s[1]) in file_of)) {
        out = base; start = 1
    } else {
        return ""
    }
    for (i = start; i <= n; i++) out = (out == "" ? s[i] : out "::" s[i])
    return out == "" ? "::" : out
}
# The deepest file of src/ that an absolute path names.
function file_named(abs,    m) {
    m = abs
    while (m != "") {
        if (m in file_of) return file_of[m]
        if (m !~ /::/) return ""
        sub(/::[^:]*$/, "", m)
    }
    return ""
}
function note(abs, is_code, file, line,    room, target) {
    if (abs == "" || abs == "::") return
    room = abs; sub(/::.*/, "", room)
    if (!(room in floor)) {
        # Through the crate root: fine for a doc link, not for code.
        if (is_code && room ~ /^[A-Za-z_]/)
            fail(file ":" line ": crate::" room " goes through the crate root; name its room")
        return
    }
    if (room != this_room && floor[room] <= floor[this_room])
        fail(file ":" line ": " this_room " (floor " floor[this_room] ") names " room " (floor " floor[room] "), which is not below it")
    if (!is_code) return
    target = file_named(abs)
    if (target == "" || target == file) return
    # A parent module the file stands in: declared there, not a circle.
    if (target ~ /\/mod\.rs$/ && index(file, substr(target, 1, length(target) - 6)) == 1) return
    if (!((file SUBSEP target) in edge)) edge[file, target] = line
}
# Expand one `use` tree: "a::b::{c, d::{e, f}}" into each full path.
function use_paths(tree, out,    open, prefix, inner, depth, i, c, item, n) {
    gsub(/[ \t]+as[ \t]+[A-Za-z0-9_]+/, "", tree)
    gsub(/[ \t\n]/, "", tree)
    open = index(tree, "{")
    if (open == 0) {
        sub(/::\*$/, "", tree)
        out[++out[0]] = tree
        return
    }
    prefix = substr(tree, 1, open - 1)
    inner = substr(tree, open + 1, length(tree) - open - 1)
    depth = 0; item = ""
    n = length(inner)
    for (i = 1; i <= n + 1; i++) {
        c = (i <= n) ? substr(inner, i, 1) : ","
        if (c == "{") depth++
        if (c == "}") depth--
        if (c == "," && depth == 0) {
            if (item == "self") use_paths(substr(prefix, 1, length(prefix) - 2), out)
            else if (item != "") use_paths(prefix item, out)
            item = ""
        } else {
            item = item c
        }
    }
}
BEGIN {
    n = split(floor_list, pairs, " ")
    for (i = 1; i <= n; i++) {
        split(pairs[i], kv, "=")
        floor[kv[1]] = kv[2]
    }
    n = split(file_list, all, "\n")
    for (i = 1; i <= n; i++) file_of[module_of(all[i])] = all[i]
}
FNR == 1 {
    file = FILENAME
    base_file = module_of(file)
    this_room = base_file; sub(/::.*/, "", this_room)
    depth = 0; inline = 0; stmt = ""
}
{
    line = $0
    # Strings and char literals hold no paths.
    gsub(/"([^"\\]|\\.)*"/, "\"\"", line)
    gsub(/\047([^\047\\]|\\.)\047/, "\047\047", line)
    is_code = (line !~ /^[ \t]*\/\//)
    if (is_code) sub(/\/\/.*$/, "", line)
    # Inline modules (`mod tests {`): `super` inside one is this file.
    base = base_file
    for (k = 1; k <= inline; k++) base = base "::" inline_name[k]
    if (is_code && line ~ /^[ \t]*(pub(\([a-z]+\))? )?mod [A-Za-z0-9_]+ *\{/) {
        name = line; sub(/^[ \t]*(pub(\([a-z]+\))? )?mod /, "", name); sub(/ *\{.*/, "", name)
        inline++; inline_name[inline] = name; inline_depth[inline] = depth
    }
    if (is_code) {
        opens = gsub(/\{/, "{", line); closes = gsub(/\}/, "}", line)
        depth += opens - closes
        while (inline > 0 && depth <= inline_depth[inline]) inline--
    }
    # `use` statements, joined across lines, relative paths included.
    if (is_code && (stmt != "" || line ~ /^[ \t]*(pub(\([a-z]+\))? )?use /)) {
        if (stmt == "") stmt_line = FNR
        stmt = stmt " " line
        if (line ~ /;/) {
            tree = stmt
            sub(/^[ \t]*(pub(\([a-z]+\))? )?use /, "", tree)
            sub(/;.*$/, "", tree)
            delete got; got[0] = 0
            use_paths(tree, got)
            for (k = 1; k <= got[0]; k++) note(absolute(got[k], base, 1), 1, file, stmt_line)
            stmt = ""
        }
        next
    }
    rest = line
    while (match(rest, /(^|[^A-Za-z0-9_$:])(crate|super|self)(::[A-Za-z_][A-Za-z0-9_]*)+/)) {
        path = substr(rest, RSTART, RLENGTH)
        sub(/^[^a-z]/, "", path)
        rest = substr(rest, RSTART + RLENGTH)
        note(absolute(path, base, 0), is_code, file, FNR)
    }
}
END {
    for (pair in edge) {
        split(pair, ab, SUBSEP)
        if (ab[1] < ab[2] && ((ab[2] SUBSEP ab[1]) in edge))
            fail(ab[1] ":" edge[ab[1], ab[2]] " and " ab[2] ":" edge[ab[2], ab[1]] " import each other")
    }
    exit failed
}
' $files || status=1
[ "$status" -eq 0 ] || exit 1
echo "layers: ok (${floors[*]})"
