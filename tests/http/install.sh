#!/bin/sh
# tests/http/install.sh DIR — install the pinned npm clients of the HTTP
# gateway tests (tests/http/package.json, package-lock.json) into DIR
# (DIR/node_modules) with `npm ci`, and copy the test scripts there (Node
# resolves their imports from DIR). The install is kept while the lock
# file, package.json and Node's version are the same (DIR/.installed).
# Exit 1 with a FAIL line when node or npm is missing or npm ci fails:
# a test that needs the clients must then fail, not skip.
here=$(dirname "$0")
dir=${1:?usage: tests/http/install.sh DIR}
command -v node >/dev/null 2>&1 || { echo "FAIL: node is not installed (make deps installs it)"; exit 1; }
command -v npm >/dev/null 2>&1 || { echo "FAIL: npm is not installed (make deps installs it)"; exit 1; }
# openai 6.x supports Node.js 20 and later (its README); Debian 12's own
# nodejs is 18: say so rather than fail obscurely inside the SDK
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 20 ] 2>/dev/null ||
    { echo "FAIL: node $(node --version) is too old: the pinned openai client needs Node.js 20 or later"; exit 1; }
mkdir -p "$dir" || exit 1
key=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)-$(node --version)
if [ "$(cat "$dir/.installed" 2>/dev/null)" = "$key" ] && [ -d "$dir/node_modules/openai" ] &&
    [ -d "$dir/node_modules/ollama" ]; then
    echo "npm clients: installed already in $dir ($(cd "$dir" && node -p \
        'const v=(p)=>require("./node_modules/"+p+"/package.json").version; "openai "+v("openai")+", ollama "+v("ollama")'))"
else
    rm -f "$dir/.installed"
    cp "$here/package.json" "$here/package-lock.json" "$dir/" || exit 1
    echo "npm clients: npm ci in $dir"
    # the cache stays in the build folder; no install scripts run
    if ! (cd "$dir" && timeout 600 npm ci --no-audit --no-fund --ignore-scripts \
            --cache "$PWD/.npm-cache" --loglevel=error); then
        echo "FAIL: npm ci of tests/http/package-lock.json failed"
        exit 1
    fi
    echo "$key" >"$dir/.installed"
fi
cp "$here"/*.mjs "$dir/" || exit 1
