#!lua
-- refund.lua takes back what decide.lua consumed for some rules. In Redis
-- Cluster a request whose keys span several hash slots is decided by one
-- decide.lua call per slot; when one slot denies after another admitted, the
-- admitting slots are refunded, so the request consumes nothing, as a single
-- call would. Each rule is refunded from the state decide.lua wrote, found
-- by the refund token decide.lua returned, not by the time: the clock may
-- have stepped since.
--
-- KEYS: every key of the call, all of one hash slot (as decide.lua).
-- ARGV[1]: little-endian binary (struct formats in brackets):
--   header   [d] the time in µs since 2020-01-01T00:00:00Z, or -1 to read
--            Redis TIME; [H] the number of rules; [H] the number of
--            policies
--   policies per policy: [H] id, [B] algorithm (as in decide.lua),
--            [d] limit, [d] window (µs), [d] burst, [d] delay (µs),
--            [d] max cost
--   rules    per rule: [H] policy id, [d] cost, [H] key length and the key,
--            [d] the refund token decide.lua returned for it, [d] the
--            request's id
-- Reply: the number of rules whose consumption no longer counts: refunded,
-- or already out of the window. A rule that still counts (a log rewritten
-- since) is missing from the count, for the caller to report.
--
-- A refund restores the counts, not the expiry: a key may live somewhat
-- longer than its state needs, never shorter.

local sunpack, spack = struct.unpack, struct.pack
local sub, format, find = string.sub, string.format, string.find
local min, max = math.min, math.max
local call = redis.call

-- wire names: scripts/layout.go's; scripts.go puts each value in place of its
-- name, and drops this block, before Redis sees the script.
local FIXED_WINDOW = 1
local SLIDING_WINDOW_LOG = 2
local SLIDING_WINDOW_COUNTER = 3
local TOKEN_BUCKET = 4
local LEAKY_BUCKET = 5
local GCRA = 6
local EPOCH_MICROS = 1577836800000000

local blob = ARGV[1]
local now, nrules, npol, pos = sunpack('<dHH', blob)
if now < 0 then
  local t = call('TIME')
  now = max(tonumber(t[1]) * 1000000 + tonumber(t[2]) - EPOCH_MICROS, 0)
end

local PA, PL, PW, PB = {}, {}, {}, {}
for _ = 1, npol do
  local id, a, L, W, B
  id, a, L, W, B, _, _, pos = sunpack('<HBddddd', blob, pos)
  PA[id], PL[id], PW[id], PB[id] = a, L, W, B
end

-- readable fails the call if a key cannot be read (an ACL, say): the
-- refund is then retried or reported, never counted as settled. A key of
-- the wrong type reads as no state.
local function readable(v)
  if type(v) == 'table' and v.err and not find(v.err, 'WRONGTYPE', 1, true) then
    error(v)
  end
  return v
end

local function hexes(v)
  if type(v) ~= 'string' then
    return nil
  end
  local i = find(v, ':', 1, true)
  if not i then
    return nil
  end
  local j = find(v, ':', i + 1, true)
  if j then
    return tonumber(sub(v, 1, i - 1), 16), tonumber(sub(v, i + 1, j - 1), 16), tonumber(sub(v, j + 1), 16)
  end
  return tonumber(sub(v, 1, i - 1), 16), tonumber(sub(v, i + 1), 16), 0
end

local function pair(v)
  if type(v) ~= 'string' or #v ~= 16 then
    return nil
  end
  return sunpack('<dd', v)
end

local settled = 0
for _ = 1, nrules do
  local id, cost, k, tok, rid
  id, cost, k, tok, rid, pos = sunpack('<HdHc0dd', blob, pos)
  local a = PA[id]
  if a == FIXED_WINDOW then -- fixed_window: the window decide.lua wrote, if still stored
    local w, n = hexes(readable(redis.pcall('GET', k)))
    if w == tok then
      call('SET', k, format('%x:%x', w, max(n - cost, 0)), 'KEEPTTL')
    end
    settled = settled + 1
  elseif a == SLIDING_WINDOW_COUNTER then -- sliding_window_counter: the window, or it as the previous
    local w, n, p = hexes(readable(redis.pcall('GET', k)))
    if w == tok then
      call('SET', k, format('%x:%x:%x', w, max(n - cost, 0), p), 'KEEPTTL')
    elseif w == tok + 1 then
      call('SET', k, format('%x:%x:%x', w, n, max(p - cost, 0)), 'KEEPTTL')
    end
    settled = settled + 1
  elseif a == TOKEN_BUCKET or a == LEAKY_BUCKET or a == GCRA then
    local t, x = pair(readable(redis.pcall('GET', k)))
    if t then
      if a == TOKEN_BUCKET then -- token_bucket: give the tokens back
        x = min(PB[id], x + cost)
      else -- leaky_bucket, gcra: drain the cost
        x = max(x - cost, 0)
      end
      call('SET', k, spack('<dd', t, x), 'KEEPTTL')
    end
    settled = settled + 1
  elseif a == SLIDING_WINDOW_LOG then -- sliding_window_log: remove the request's entry, shift the later ones
    -- The entry is found by its time and the request's id: other refunds
    -- may have renumbered its total since.
    local suffix = format(':%x', rid)
    local ok, at = pcall(call, 'ZRANGE', k, tok, tok, 'BYSCORE')
    local member
    if ok then
      for _, m in ipairs(at) do
        if sub(m, 15) == suffix then
          member = m
        end
      end
    end
    if not member then
      -- Gone with its key (expired: nothing counts), or not there.
      if ok and call('EXISTS', k) == 0 then
        settled = settled + 1
      end
    elseif tok <= now - PW[id] then
      settled = settled + 1 -- already out of the window
    else
      local rank = call('ZRANK', k, member)
      call('ZREM', k, member)
      local later = call('ZRANGE', k, rank, -1)
      for _, m in ipairs(later) do
        local score = call('ZSCORE', k, m)
        call('ZREM', k, m)
        call('ZADD', k, score, format('%014x', tonumber(sub(m, 1, 14), 16) - cost) .. sub(m, 15))
      end
      settled = settled + 1
    end
  end
end
return settled
