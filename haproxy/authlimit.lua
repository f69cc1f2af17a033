-- authlimit for HAProxy 2.6 or later (built with Lua, as Debian's is): an
-- action that asks authlimit about each request with core.httpclient() and
-- denies, or lets the request go on with the rate-limit headers stored for
-- the answer. haproxy.cfg beside this file shows its use.
--
-- The action sends its requests to HAProxy's own "listen authlimit"
-- section, whose server is authlimit: that section holds the address, the
-- timeouts and the connections to authlimit, which it keeps open and
-- reuses. It also keeps a request from being sent twice:
-- HAProxy 2.6's httpclient resends a request that timed out (up to 3
-- times), while a proxy section answers 504 once its "timeout server" has
-- passed, and resends nothing (retries only redo failed connects).
--
-- Two settings, read on every request from proc variables set in
-- haproxy.cfg's global section:
--   proc.authlimit_socket       the address the listen section binds
--                               (default abns@authlimit)
--   proc.authlimit_unreachable  "closed" (the default): answer 503 when
--                               authlimit cannot be reached or does not
--                               answer in time; "open": let the request
--                               through
--
-- The request to authlimit states what HAProxy knows itself: the client
-- address from HAProxy's own connection (X-Forwarded-For), the method, the
-- path and query, the host, the scheme, and the body's length
-- (X-Original-Content-Length, absent when the body is chunked). Every other
-- header of the client's goes along, each copy on its own line, so that
-- authlimit refuses a repeated key header instead of counting one copy;
-- what the client sends under X-Forwarded-*, X-Real-IP, X-Original-* or
-- Forwarded is dropped. A request without Host is refused (400): host=
-- rules could not apply to it.
--
-- authlimit's answer:
--   2xx: the request goes on; the rate-limit headers authlimit sent are
--        stored in txn.authlimit_<name> variables (lower case, dashes as
--        underscores) for haproxy.cfg's http-after-response lines;
--   anything else from authlimit (its denial, its 503 when Redis is down):
--        relayed to the client as it is: status, rate-limit headers,
--        Retry-After, Content-Type and the problem JSON body;
--   no answer (HAProxy's own 502, 503 or 504: refused, reset, timed out):
--        proc.authlimit_unreachable decides.

-- The URL of the requests: sent to proc.authlimit_socket, its host routes
-- nothing, and authlimit reads the client's host from X-Forwarded-Host.
local url = "http://authlimit/auth"

-- A bound on the httpclient's own wait, far above the listen section's
-- timeouts: the section answers first, so the httpclient never resends.
local safety_timeout_ms = 120000

-- The headers relayed from authlimit's answer.
local relayed = { "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset",
                  "ratelimit-policy", "ratelimit", "retry-after" }

-- The client's headers that never reach authlimit: those this action
-- states itself, and the hop-by-hop ones.
local dropped = {
    ["host"] = true, ["content-length"] = true, ["transfer-encoding"] = true,
    ["connection"] = true, ["keep-alive"] = true, ["proxy-connection"] = true,
    ["te"] = true, ["trailer"] = true, ["upgrade"] = true, ["expect"] = true,
    ["x-real-ip"] = true, ["forwarded"] = true,
}

-- is_dropped tells whether a header name (in lower case) is one of those;
-- '_' counts as '-', as authlimit compares header names.
local function is_dropped(name)
    name = name:gsub("_", "-")
    return dropped[name] or name:sub(1, 12) == "x-forwarded-" or name:sub(1, 11) == "x-original-"
end

-- first returns the first value of a header of an httpclient or
-- req_get_headers table, whose lists start at index 0.
local function first(headers, name)
    local values = headers and headers[name]
    if values == nil then
        return nil
    end
    return values[0] or values[1]
end

-- request builds the headers of the request to authlimit.
local function request(txn)
    local headers = {}
    -- The names the client sent, '_' as '-'.
    local sent = {}
    for name, values in pairs(txn.http:req_get_headers()) do
        name = name:lower()
        sent[name:gsub("_", "-")] = true
        if not is_dropped(name) then
            local list = headers[name] or {}
            local i = 0
            while values[i] ~= nil do
                list[#list + 1] = values[i]
                i = i + 1
            end
            headers[name] = list
        end
    end
    -- A boolean fetch gives 0 or 1 (both true in Lua).
    local proto = "http"
    if txn.sf:ssl_fc() == "1" then
        proto = "https"
    end
    -- The httpclient adds these when they are absent (User-Agent: HAProxy):
    -- an empty one is absent to authlimit.
    for _, name in ipairs({ "user-agent", "accept" }) do
        if not sent[name] then
            headers[name] = { "" }
        end
    end
    headers["x-forwarded-for"] = { txn.f:src() }
    headers["x-forwarded-method"] = { txn.f:method() }
    -- The path and query; the request target itself when it has no path
    -- ("OPTIONS *").
    headers["x-forwarded-uri"] = { txn.f:pathq() or txn.f:url() }
    headers["x-forwarded-proto"] = { proto }
    headers["x-forwarded-host"] = { txn.f:req_hdr("host") }
    local length = txn.f:req_hdr("content-length")
    if length ~= nil then
        headers["x-original-content-length"] = { length }
    end
    return headers
end

-- unreachable answers as proc.authlimit_unreachable says.
local function unreachable(txn, why)
    txn:Warning("authlimit unreachable: " .. why)
    if txn:get_var("proc.authlimit_unreachable") == "open" then
        return
    end
    txn:done{
        status = 503,
        headers = { ["content-type"] = { "application/problem+json" }, ["retry-after"] = { "1" } },
        body = '{"type":"urn:authlimit:unreachable","title":"Service Unavailable","status":503,"detail":"The rate limiter could not be reached."}',
    }
end

core.register_action("authlimit", { "http-req" }, function(txn)
    -- Without a Host (HTTP/1.0 allows it), host= rules could not apply:
    -- refuse rather than let the request past them.
    if txn.f:req_hdr("host") == nil then
        return txn:done{ status = 400, headers = { ["content-type"] = { "text/plain" } }, body = "Host header required\n" }
    end
    local destination = txn:get_var("proc.authlimit_socket") or "abns@authlimit"
    local ok, res = pcall(function()
        return core.httpclient():get{ url = url, dst = destination, headers = request(txn), timeout = safety_timeout_ms }
    end)
    if not ok then
        return unreachable(txn, tostring(res))
    end
    local status = res and tonumber(res.status) or 0
    local ctype = first(res and res.headers, "content-type")
    if status == 0 or (status >= 502 and status <= 504 and ctype ~= "application/problem+json") then
        return unreachable(txn, "status " .. status)
    end
    if status >= 200 and status < 300 then
        for _, name in ipairs(relayed) do
            local value = first(res.headers, name)
            if value ~= nil then
                txn:set_var("txn.authlimit_" .. name:gsub("-", "_"), value)
            end
        end
        return
    end
    local headers = {}
    for _, name in ipairs(relayed) do
        local value = first(res.headers, name)
        if value ~= nil then
            headers[name] = { value }
        end
    end
    if ctype ~= nil then
        headers["content-type"] = { ctype }
    end
    txn:done{ status = status, headers = headers, body = res.body or "" }
end, 0)
