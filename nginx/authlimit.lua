-- authlimit.lua: authlimit for nginx's Lua module (OpenResty, or Debian's
-- nginx with libnginx-mod-http-lua), without a subrequest.
--
-- access_by_lua asks authlimit's /auth over HTTP/1.1 on a pooled cosocket
-- and relays its answer: a denial (status, headers, problem+json body) goes
-- to the client as it is; on an allowed request the rate-limit headers are
-- added to the backend's answer by header_filter_by_lua. nginx/openresty.conf
-- shows the whole setup; copy both files.
--
-- Setup, in nginx's http {} block:
--
--   lua_package_path "/etc/nginx/lua/?.lua;;";   -- the directory of this file
--   init_by_lua_block {
--       require("authlimit").configure({ address = "127.0.0.1:8080" })
--   }
--
-- and in each location it guards:
--
--   access_by_lua_block { require("authlimit").access() }
--   header_filter_by_lua_block { require("authlimit").header_filter() }
--
-- nginx allows one init_by_lua_block per http {}: if you have one, add the
-- configure call to it. configure raises an error naming the option for a
-- bad setting, so nginx refuses to start with it.
--
-- Options of configure (all optional):
--
--   address          "host:port" or "unix:/path/to.sock" of authlimit.
--                    Default "127.0.0.1:8080". A host name needs nginx's
--                    resolver directive; an IP address or socket does not.
--   host_header      the Host header sent to authlimit. Default: the host
--                    of address ("localhost" for a socket). authlimit reads
--                    the client's host from X-Forwarded-Host, never this.
--   path             authlimit's path. Default "/auth".
--   connect_timeout  milliseconds to connect. Default 1000.
--   send_timeout     milliseconds to write the request. Default 1000.
--   read_timeout     milliseconds to wait for each read of the answer.
--                    Default 65000: authlimit answers within
--                    AUTHLIMIT_REDIS_TIMEOUT, but a leaky_bucket rule with
--                    delay= holds a request up to 1 minute.
--   pool_size        idle connections kept per nginx worker. Default 256:
--                    as many as requests are in flight at once per worker.
--   pool_idle_timeout milliseconds an idle connection is kept. Default
--                    60000, below authlimit's 2 minutes.
--   backlog          when set, at most pool_size connections are open at
--                    once per worker and up to backlog more requests wait
--                    for one (failing as unreachable after connect_timeout).
--                    Default unset: connections beyond pool_size are opened
--                    and closed after use.
--   unreachable      "closed" (default): a client gets 503 when authlimit
--                    cannot be reached or answers badly; "open": the request
--                    goes on, unlimited. The nginx variable
--                    $authlimit_unreachable, set to "closed" or "open" in a
--                    server or location, overrides it there (any other
--                    value leaves this option in force).
--   max_body         largest answer body read, bytes. Default 65536.
--
-- What authlimit gets, as nginx/example.conf's subrequest sends it, nginx
-- stating the original request itself and replacing whatever the client
-- sent under these names:
--
--   GET <path>            Host: <host_header>
--   X-Forwarded-For       nginx's $remote_addr: the connection's address
--                         (set it right with the realip module if nginx is
--                         behind a load balancer), never a client's header
--   X-Forwarded-Method    the request's method
--   X-Forwarded-Uri       $request_uri: path and query as the client sent
--   X-Forwarded-Host      $host
--   X-Forwarded-Proto     $scheme
--   X-Original-Content-Length  the request's Content-Length, for rules
--                         that count bytes; not sent when it has none (a
--                         chunked upload)
--
-- and every other header of the client's request, each line as it came:
-- a header sent twice reaches authlimit twice, so a key=header: or
-- cost=header: rule refuses it as repeated-header. Not passed: the
-- client's X-Real-IP, X-Original-URI, X-Original-URL, X-Forwarded-Port,
-- X-Forwarded-Server, Forwarded, Content-Length and the hop-by-hop headers
-- (Connection, Keep-Alive, Proxy-Connection, TE, Trailer,
-- Transfer-Encoding, Upgrade, Expect).
--
-- What the client gets:
--
--   authlimit allows (2xx)   the request goes on; the answer gets
--                            authlimit's X-RateLimit-Limit,
--                            X-RateLimit-Remaining, X-RateLimit-Reset,
--                            RateLimit-Policy, RateLimit (header_filter)
--   authlimit answers other  that status, those headers, Retry-After,
--   (429, 503, ...)          Content-Type and authlimit's body
--   authlimit unreachable,   503 (nginx's page), or the request goes on
--   timed out, or a bad      with unreachable = "open"; the error log says
--   answer                   why ("authlimit unreachable: ...")
--   a request header with    400: it could not be passed on whole
--   CR or LF in its value, or
--   a name that is not an
--   HTTP token (possible only
--   with ignore_invalid_headers
--   off)
--
-- A bad answer is one that is not HTTP/1.x with a status from 200 to 599;
-- has a header line without a colon, a folded line, more than 100 header
-- lines, a line over 8192 bytes or a CR inside a line (each line ends in
-- CRLF or LF); a Content-Length that is not digits, or two that differ; a
-- Transfer-Encoding other than chunked, or both; a chunk size that is not
-- hex; or a body over max_body. Such a connection is closed, never
-- reused, and so is one on which authlimit sent more than its answer. An
-- answer without a length is read until authlimit closes the connection.
-- A connection that authlimit closed while idle in the pool is replaced
-- once, before any answer was read.

local ngx = ngx
local tcp = ngx.socket.tcp
local find, sub, lower, byte = string.find, string.sub, string.lower, string.byte
local tonumber, type, tostring, pairs, ipairs = tonumber, type, tostring, pairs, ipairs
local concat = table.concat

local _M = { _VERSION = "1.0" }

-- The headers relayed to the client; Retry-After and Content-Type only
-- with a denial.
local relayed = { "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit" }
local denial_only = { "Retry-After", "Content-Type" }
-- The same, each name beside its lower case form (as read_answer keeps
-- names), for the loops of access.
local relayed_pairs, denial_pairs = {}, {}
for _, name in ipairs(relayed) do
    relayed_pairs[#relayed_pairs + 1] = { name, string.lower(name) }
    denial_pairs[#denial_pairs + 1] = { name, string.lower(name) }
end
for _, name in ipairs(denial_only) do
    denial_pairs[#denial_pairs + 1] = { name, string.lower(name) }
end

-- Request headers never passed from the client: the ones stated here, the
-- ones authlimit might be configured to read the original request from,
-- and the hop-by-hop ones. Lower case, as ngx.req.get_headers gives names.
local dropped = {
    ["host"] = true, ["content-length"] = true,
    ["x-forwarded-for"] = true, ["x-forwarded-method"] = true, ["x-forwarded-uri"] = true,
    ["x-forwarded-host"] = true, ["x-forwarded-proto"] = true, ["x-forwarded-port"] = true,
    ["x-forwarded-server"] = true, ["forwarded"] = true, ["x-real-ip"] = true,
    ["x-original-uri"] = true, ["x-original-url"] = true, ["x-original-content-length"] = true,
    ["connection"] = true, ["keep-alive"] = true, ["proxy-connection"] = true, ["te"] = true,
    ["trailer"] = true, ["transfer-encoding"] = true, ["upgrade"] = true, ["expect"] = true,
}

local max_header_lines = 100
local max_line = 8192

local defaults = {
    address = "127.0.0.1:8080",
    path = "/auth",
    connect_timeout = 1000,
    send_timeout = 1000,
    read_timeout = 65000,
    pool_size = 256,
    pool_idle_timeout = 60000,
    unreachable = "closed",
    max_body = 65536,
}

local known = {
    address = "string", host_header = "string", path = "string",
    connect_timeout = "number", send_timeout = "number", read_timeout = "number",
    pool_size = "number", pool_idle_timeout = "number", backlog = "number",
    unreachable = "string", max_body = "number",
}

local config -- set by configure

-- validate checks opts and returns the settings, or nil and every problem
-- found, each naming its option.
local function validate(opts)
    if opts == nil then
        opts = {}
    end
    if type(opts) ~= "table" then
        return nil, "authlimit.configure: options must be a table, got " .. type(opts)
    end
    local problems = {}
    for k, v in pairs(opts) do
        local want = known[k]
        if not want then
            problems[#problems + 1] = "unknown option " .. tostring(k)
        elseif type(v) ~= want then
            problems[#problems + 1] = k .. " must be a " .. want .. ", got " .. type(v)
        end
    end
    if #problems > 0 then
        return nil, "authlimit.configure: " .. concat(problems, "; ")
    end
    local c = {}
    for k, v in pairs(defaults) do
        c[k] = v
    end
    for k, v in pairs(opts) do
        c[k] = v
    end

    if sub(c.address, 1, 5) == "unix:" then
        if #c.address == 5 then
            problems[#problems + 1] = "address " .. c.address .. " has no socket path"
        end
        c.host = c.address
        c.host_header = c.host_header or "localhost"
    else
        local host, port = c.address:match("^%[([^%]]+)%]:(%d+)$")
        if not host then
            host, port = c.address:match("^([^:]+):(%d+)$")
        end
        port = tonumber(port)
        if not host or port < 1 or port > 65535 then
            problems[#problems + 1] = "address " .. c.address .. " is not host:port (port 1-65535) or unix:/path"
        else
            -- An IPv6 address stays in brackets, as connect takes it.
            if c.address:match("^%[") then
                host = "[" .. host .. "]"
            end
            c.host, c.port = host, port
            c.host_header = c.host_header or host
        end
    end
    if c.host_header and find(c.host_header, "[%c ]") then
        problems[#problems + 1] = "host_header " .. c.host_header .. " has spaces or control characters"
    end
    if sub(c.path, 1, 1) ~= "/" or find(c.path, "[%c ]") then
        problems[#problems + 1] = "path " .. c.path .. " must start with / and have no spaces or control characters"
    end
    for _, k in ipairs({ "connect_timeout", "send_timeout", "read_timeout", "pool_idle_timeout" }) do
        if c[k] <= 0 or c[k] % 1 ~= 0 then
            problems[#problems + 1] = k .. " " .. c[k] .. " must be a whole number of milliseconds above 0"
        end
    end
    for _, k in ipairs({ "pool_size", "max_body" }) do
        if c[k] < 1 or c[k] % 1 ~= 0 then
            problems[#problems + 1] = k .. " " .. c[k] .. " must be a whole number above 0"
        end
    end
    if c.backlog and (c.backlog < 0 or c.backlog % 1 ~= 0) then
        problems[#problems + 1] = "backlog " .. c.backlog .. " must be a whole number, 0 or more"
    end
    if c.unreachable ~= "closed" and c.unreachable ~= "open" then
        problems[#problems + 1] = "unreachable " .. c.unreachable .. " must be \"closed\" or \"open\""
    end
    if #problems > 0 then
        return nil, "authlimit.configure: " .. concat(problems, "; ")
    end

    c.pool = "authlimit:" .. c.address
    c.connect_opts = { pool = c.pool, pool_size = c.pool_size, backlog = c.backlog }
    c.request_line = "GET " .. c.path .. " HTTP/1.1\r\nHost: " .. c.host_header .. "\r\n"
    return c
end

-- configure sets the options (see the top of this file) and raises an error
-- naming every bad one.
function _M.configure(opts)
    local c, err = validate(opts)
    if not c then
        error(err, 2)
    end
    config = c
end

-- build returns the request to authlimit as a table of strings, or nil if a
-- client's header cannot be passed on whole.
local function build(c)
    local var = ngx.var
    local req = {
        c.request_line,
        "X-Forwarded-For: ", var.remote_addr,
        "\r\nX-Forwarded-Method: ", ngx.req.get_method(),
        "\r\nX-Forwarded-Uri: ", var.request_uri,
        "\r\nX-Forwarded-Host: ", var.host,
        "\r\nX-Forwarded-Proto: ", var.scheme,
        "\r\n",
    }
    local n = #req
    local length = var.content_length
    if length and length ~= "" then
        req[n + 1], req[n + 2], req[n + 3] = "X-Original-Content-Length: ", length, "\r\n"
        n = n + 3
    end
    -- 0: every header, however many (the default stops at 100, and a
    -- repeat past it would go unseen).
    local headers = ngx.req.get_headers(0)
    for name, value in pairs(headers) do
        if not dropped[name] then
            -- nginx takes only token names unless ignore_invalid_headers
            -- is off; anything else could not be passed on as it came.
            -- (A dropped name is a token.)
            if find(name, "[^%w!#$%%&'*+.^_`|~-]") then
                return nil
            end
            if type(value) == "table" then
                for _, v in ipairs(value) do
                    if find(v, "\n", 1, true) or find(v, "\r", 1, true) then
                        return nil
                    end
                    req[n + 1], req[n + 2], req[n + 3], req[n + 4] = name, ": ", v, "\r\n"
                    n = n + 4
                end
            else
                if find(value, "\n", 1, true) or find(value, "\r", 1, true) then
                    return nil
                end
                req[n + 1], req[n + 2], req[n + 3], req[n + 4] = name, ": ", value, "\r\n"
                n = n + 4
            end
        end
    end
    req[n + 1] = "\r\n"
    return req
end

-- The largest header block read: max_header_lines lines of max_line bytes,
-- the status line and the line ends. Past it the answer is bad whatever
-- it holds.
local max_head = (max_header_lines + 2) * (max_line + 2)

-- A reader hands out an answer's bytes: first the ones left over after the
-- header block (buf, from pos on), then the socket's. Only a chunked body
-- or one read until the connection closes needs one.
local function reader(sock, buf, pos)
    return { sock = sock, buf = buf, pos = pos }
end

-- take returns up to n bytes the reader has buffered, or nil if none.
local function take(r, n)
    local left = #r.buf - r.pos + 1
    if left <= 0 then
        return nil
    end
    if n > left then
        n = left
    end
    local data = sub(r.buf, r.pos, r.pos + n - 1)
    r.pos = r.pos + n
    return data
end

-- read_line reads one line (without its LF and any CR) of at most
-- max_line bytes.
local function read_line(r)
    local left = #r.buf - r.pos + 1
    if left > 0 then
        local lf = find(r.buf, "\n", r.pos, true)
        if lf then
            local line = sub(r.buf, r.pos, lf - 1)
            r.pos = lf + 1
            if #line > max_line then
                return nil, "a line over " .. max_line .. " bytes"
            end
            return (line:gsub("\r", ""))
        end
    end
    local head = take(r, left) or ""
    local line, err = r.sock:receive("*l")
    if not line then
        return nil, err
    end
    line = head:gsub("\r", "") .. line
    if #line > max_line then
        return nil, "a line over " .. max_line .. " bytes"
    end
    return line
end

-- read_bytes reads exactly n bytes.
local function read_bytes(r, n)
    local head = take(r, n) or ""
    if #head == n then
        return head
    end
    local data, err = r.sock:receive(n - #head)
    if not data then
        return nil, err
    end
    return head .. data
end

-- read_chunked reads a chunked body of at most max bytes and its trailer.
local function read_chunked(r, max)
    local parts, total = {}, 0
    while true do
        local line, err = read_line(r)
        if not line then
            return nil, "chunk size: " .. err
        end
        local semi = find(line, ";", 1, true)
        local hex = semi and sub(line, 1, semi - 1) or line
        hex = hex:match("^%s*(%x+)%s*$")
        if not hex or #hex > 8 then
            return nil, "chunk size " .. line:sub(1, 40) .. " is not hex"
        end
        local size = tonumber(hex, 16)
        if size == 0 then
            break
        end
        total = total + size
        if total > max then
            return nil, "a body over " .. max .. " bytes"
        end
        local data
        data, err = read_bytes(r, size)
        if not data then
            return nil, "chunk: " .. err
        end
        parts[#parts + 1] = data
        line, err = read_line(r)
        if line ~= "" then
            return nil, "chunk not followed by CRLF" .. (err and ": " .. err or "")
        end
    end
    for _ = 1, max_header_lines do
        local line, err = read_line(r)
        if not line then
            return nil, "trailer: " .. err
        end
        if line == "" then
            return concat(parts)
        end
    end
    return nil, "more than " .. max_header_lines .. " trailer lines"
end

-- read_to_close reads a body delimited by the end of the connection.
local function read_to_close(r, max)
    local first = take(r, max + 1)
    local parts, total = { first }, first and #first or 0
    if total > max then
        return nil, "a body over " .. max .. " bytes"
    end
    while true do
        local data, err, partial = r.sock:receive(4096)
        data = data or partial
        if data and #data > 0 then
            total = total + #data
            if total > max then
                return nil, "a body over " .. max .. " bytes"
            end
            parts[#parts + 1] = data
        end
        if err == "closed" then
            return concat(parts)
        elseif err then
            return nil, "body: " .. err
        end
    end
end

-- read_head reads up to the end of the header block: whatever the socket
-- has, at once, until an empty line. It returns what it read and where the
-- block's end (its last LF) is; or nil, the error and whether nothing at
-- all was read (the connection was found closed).
local function read_head(sock)
    local buf, err = sock:receiveany(max_head)
    if not buf then
        return nil, "status line: " .. err, err == "closed" or err == "connection reset by peer"
    end
    while true do
        local _, e = find(buf, "\n\r?\n")
        if e then
            return buf, e
        end
        if #buf > max_head then
            return nil, "a header block over " .. max_head .. " bytes"
        end
        local more
        more, err = sock:receiveany(max_head)
        if not more then
            return nil, "header: " .. err
        end
        buf = buf .. more
    end
end

-- read_answer reads one answer. It returns the status, the headers (lower
-- case names, each a list of values), the body and whether the connection
-- may be kept; or nil, the error and whether nothing at all was read (the
-- connection was found closed).
local function read_answer(sock, c)
    local buf, stop, closed = read_head(sock)
    if not buf then
        return nil, stop, closed
    end
    -- The status line, then each header line up to the empty one; every
    -- line ends in LF, its CR optional as before.
    local lf = find(buf, "\n", 1, true)
    local line = sub(buf, 1, lf - 1)
    if byte(line, -1) == 13 then
        line = sub(line, 1, -2)
    end
    local minor, status, rest = line:match("^HTTP/1%.([01]) (%d%d%d)(.*)$")
    status = tonumber(status)
    if not status or (rest ~= "" and byte(rest, 1) ~= 32) or #line > max_line or find(line, "\r", 1, true) then
        return nil, "status line " .. line:sub(1, 40) .. " is not HTTP/1.x"
    end
    if status < 200 or status > 599 then
        return nil, "status " .. status .. " out of 200-599"
    end
    local headers = {}
    local lines = 0
    local pos = lf + 1
    while true do
        lf = find(buf, "\n", pos, true)
        line = sub(buf, pos, lf - 1)
        pos = lf + 1
        if byte(line, -1) == 13 then
            line = sub(line, 1, -2)
        end
        if line == "" then
            break
        end
        lines = lines + 1
        if lines > max_header_lines then
            return nil, "more than " .. max_header_lines .. " header lines"
        end
        if #line > max_line then
            return nil, "header: a line over " .. max_line .. " bytes"
        end
        local first = byte(line, 1)
        if first == 32 or first == 9 then
            return nil, "a folded header line"
        end
        -- A name of token characters, then the colon.
        local _, colon = find(line, "^[%w!#$%%&'*+.^_`|~-]+:")
        if not colon or find(line, "\r", colon, true) then
            return nil, "header line " .. line:sub(1, 40) .. " is not name: value"
        end
        local name = lower(sub(line, 1, colon - 1))
        -- The value without the spaces and tabs around it.
        local vs, ve = colon + 1, #line
        local b = byte(line, vs)
        while b == 32 or b == 9 do
            vs = vs + 1
            b = byte(line, vs)
        end
        b = byte(line, ve)
        while ve >= vs and (b == 32 or b == 9) do
            ve = ve - 1
            b = byte(line, ve)
        end
        local value = sub(line, vs, ve)
        local vals = headers[name]
        if vals then
            vals[#vals + 1] = value
        else
            headers[name] = { value }
        end
    end
    -- pos is past the header block: the rest of buf is the body's start.

    local keep = minor == "1"
    local conn = headers["connection"]
    if conn then
        for _, v in ipairs(conn) do
            v = lower(v)
            if find(v, "close", 1, true) then
                keep = false
            elseif find(v, "keep-alive", 1, true) then
                keep = true
            end
        end
    end

    local te, cl = headers["transfer-encoding"], headers["content-length"]
    local body, err
    if te then
        if cl then
            return nil, "both Transfer-Encoding and Content-Length"
        end
        if #te ~= 1 or lower(te[1]) ~= "chunked" then
            return nil, "Transfer-Encoding " .. concat(te, ", ") .. " is not chunked"
        end
        local r = reader(sock, buf, pos)
        body, err = read_chunked(r, c.max_body)
        if not body then
            return nil, err
        end
        -- Bytes after the answer: not an answer to anything asked.
        if r.pos <= #buf then
            keep = false
        end
    elseif cl then
        local length = cl[1]
        for _, v in ipairs(cl) do
            if v ~= length then
                return nil, "Content-Length given twice, differently"
            end
        end
        if not find(length, "^%d+$") or #length > 9 then
            return nil, "Content-Length " .. length:sub(1, 40) .. " is not a number"
        end
        length = tonumber(length)
        if length > c.max_body then
            return nil, "a body over " .. c.max_body .. " bytes"
        end
        local have = #buf - pos + 1
        if have >= length then
            body = sub(buf, pos, pos + length - 1)
            -- Bytes after the answer: not an answer to anything asked.
            if have > length then
                keep = false
            end
        else
            local more
            more, err = sock:receive(length - have)
            if not more then
                return nil, "body: " .. err
            end
            body = have > 0 and sub(buf, pos) .. more or more
        end
    elseif status == 204 or status == 304 then
        body = ""
        if pos <= #buf then
            keep = false
        end
    else
        body, err = read_to_close(reader(sock, buf, pos), c.max_body)
        if not body then
            return nil, err
        end
        keep = false
    end
    return status, headers, body, keep
end

-- ask sends the request on a pooled connection and reads the answer. A
-- connection from the pool that authlimit had closed (nothing read) is
-- replaced once by another.
local function ask(c, req)
    for attempt = 1, 2 do
        local sock = tcp()
        sock:settimeouts(c.connect_timeout, c.send_timeout, c.read_timeout)
        local ok, err
        if c.port then
            ok, err = sock:connect(c.host, c.port, c.connect_opts)
        else
            ok, err = sock:connect(c.host, c.connect_opts)
        end
        if not ok then
            return nil, "connect " .. c.address .. ": " .. tostring(err)
        end
        local reused = (sock:getreusedtimes() or 0) > 0
        local stale
        ok, err = sock:send(req)
        if not ok then
            stale = reused
            err = "send: " .. tostring(err)
        else
            local status, headers, body, keep = read_answer(sock, c)
            if status then
                -- setkeepalive refuses a connection with bytes left
                -- unread: close it then.
                if not keep or not sock:setkeepalive(c.pool_idle_timeout) then
                    sock:close()
                end
                return status, headers, body
            end
            err = headers
            stale = reused and body
        end
        sock:close()
        if not stale or attempt == 2 then
            return nil, err
        end
    end
end

-- fail answers for an authlimit that could not decide: 503, or nothing
-- (the request goes on) when unreachable is "open".
local function fail(c, why)
    ngx.log(ngx.ERR, "authlimit unreachable: ", why)
    local mode = ngx.var.authlimit_unreachable
    if mode ~= "open" and mode ~= "closed" then
        mode = c.unreachable
    end
    if mode == "open" then
        return
    end
    return ngx.exit(ngx.HTTP_SERVICE_UNAVAILABLE)
end

-- access decides the request: call it from access_by_lua.
function _M.access()
    local c = config
    if not c then
        ngx.log(ngx.ERR, "authlimit: access() before configure()")
        return ngx.exit(ngx.HTTP_INTERNAL_SERVER_ERROR)
    end
    local req = build(c)
    if not req then
        return ngx.exit(ngx.HTTP_BAD_REQUEST)
    end
    local status, headers, body = ask(c, req)
    if not status then
        return fail(c, headers)
    end
    if status < 300 then
        local kept
        for i = 1, #relayed_pairs do
            local p = relayed_pairs[i]
            local v = headers[p[2]]
            if v then
                kept = kept or {}
                kept[p[1]] = #v == 1 and v[1] or v
            end
        end
        if kept then
            ngx.ctx.authlimit = kept
        end
        return
    end
    -- A denial (or authlimit's 503): relay it as it is.
    ngx.status = status
    for i = 1, #denial_pairs do
        local p = denial_pairs[i]
        local v = headers[p[2]]
        if v then
            ngx.header[p[1]] = #v == 1 and v[1] or v
        end
    end
    ngx.header["Content-Length"] = #body
    ngx.print(body)
    return ngx.exit(status)
end

-- header_filter adds the rate-limit headers of an allowed request to the
-- answer: call it from header_filter_by_lua.
function _M.header_filter()
    local kept = ngx.ctx.authlimit
    if kept then
        local header = ngx.header
        for name, value in pairs(kept) do
            header[name] = value
        end
    end
end

return _M
