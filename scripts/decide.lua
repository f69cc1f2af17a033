#!lua
-- decide.lua decides a batch of requests in one call. Each request is
-- decided all or nothing, in order: if any of its rules denies, none of its
-- rules consumes anything, and a later request of the batch sees what an
-- earlier one consumed. It is algo/eval.go and algo/log.go in Lua, step for
-- step and in the same order of floating-point operations; the differential
-- test in package algo holds the two to identical answers.
--
-- KEYS: none with a standalone or Sentinel client (the keys are in ARGV[1]);
--       in Redis Cluster, every key of the batch, all of one hash slot, so
--       the cluster routes the call and checks the slot. The script reads
--       its keys from ARGV[1] either way.
-- ARGV[1]: the batch, little-endian binary (struct formats in brackets):
--   header   [d] the time in µs since 2020-01-01T00:00:00Z, or -1 to read
--                Redis TIME (production always reads TIME, so replicas with
--                skewed clocks agree; only tests pin the time)
--            [H] the number of requests, [H] the number of policies,
--            [B] flags: 1 = reply with a refund token per rule
--   policies per policy: [H] id, [B] algorithm (1 fixed_window,
--            2 sliding_window_log, 3 sliding_window_counter, 4 token_bucket,
--            5 leaky_bucket, 6 gcra), [d] limit, [d] window (µs),
--            [d] burst, [d] delay (µs), [d] max cost (the largest cost the
--            policy ever admits)
--   requests per request: [B] the number of rules, then per rule: [H] the
--            policy id, [B] shadow (1: its denial does not deny),
--            [d] cost, [H] key length and the key
-- Reply: a binary string, per request [B] admitted (1 or 0), then per rule
--   [B] allowed (1 or 0), [B] reason (0 none, 1 limited, 2 cost too high),
--   [d] remaining, [d] reset after (µs), [d] retry after (µs), [d] delay
--   (µs), and with flag 1 [d] a refund token for refund.lua.
--   An admitted request's allowing rules answer with their counts after
--   consuming; otherwise every rule answers with the counts that stand.
--
-- State, by algorithm, each in one key that expires when its state no longer
-- matters (hex integers are written with %x):
--   fixed_window            string "<window index>:<count>" in hex
--   sliding_window_counter  string "<window index>:<count>:<previous count>"
--   token_bucket            string [dd]: last update (µs), tokens
--   leaky_bucket, gcra      string [dd]: last update (µs), level
--   sliding_window_log      sorted set: per admission, scored by its time, a
--                           member that is the running total of costs up to
--                           and including it (14 hex digits, so that members
--                           of one time sort in order), and a first member
--                           "00000000000000" scored -inf. The entry at or
--                           before the window's edge with the greatest time
--                           is always kept, so the window holds the newest
--                           total minus that entry's total, found in
--                           O(log n) however long the log.
-- Every value is computed and checked before the first write, so a call
-- never fails halfway; a key of the wrong type reads as no state and is
-- replaced. Numbers passed to Redis are formatted with %d: Lua's own
-- conversion keeps only 14 digits.

local sunpack, spack = struct.unpack, struct.pack
local sub, format, find = string.sub, string.format, string.find
local floor, ceil, min, max, fmod = math.floor, math.ceil, math.min, math.max, math.fmod
local call, pcall = redis.call, redis.pcall

local EPOCH = 1577836800000000 -- 2020-01-01T00:00:00Z in Unix µs
local REBASE = 4503599627370496 -- 2^52: a log's totals restart below this
local SWEEP = 64 -- left-behind log entries removed per admission, at most
local RETRY_STEPS = 4

local blob = ARGV[1]
local now, nreq, npol, flags, pos = sunpack('<dHHB', blob)
local pinned = now >= 0
if not pinned then
  local t = call('TIME')
  now = max(tonumber(t[1]) * 1000000 + tonumber(t[2]) - EPOCH, 0)
end
local tokens_wanted = flags % 2 == 1

local PA, PL, PW, PB, PD, PM = {}, {}, {}, {}, {}, {}
for _ = 1, npol do
  local id, a, L, W, B, D, M
  id, a, L, W, B, D, M, pos = sunpack('<HBddddd', blob, pos)
  PA[id], PL[id], PW[id], PB[id], PD[id], PM[id] = a, L, W, B, D, M
end

-- ttl turns microseconds of relevance into a key expiry in milliseconds.
-- A pinned clock runs apart from Redis's own, which expires keys: give tests
-- an hour of slack so a key never expires under a test's feet.
local function ttl(us)
  local ms = max(ceil(us / 1000), 1)
  if pinned then
    ms = ms + 3600000
  end
  return format('%d', ms)
end

local function time_for(units, W, L)
  return ceil(units * W / L)
end

-- hexes reads "a:b" or "a:b:c"; nil if v is not such a string.
local function hexes(v)
  if type(v) ~= 'string' then
    return nil
  end
  local i = find(v, ':', 1, true)
  if not i then
    return nil
  end
  local j = find(v, ':', i + 1, true)
  local a, b, c
  if j then
    a, b, c = tonumber(sub(v, 1, i - 1), 16), tonumber(sub(v, i + 1, j - 1), 16), tonumber(sub(v, j + 1), 16)
  else
    a, b, c = tonumber(sub(v, 1, i - 1), 16), tonumber(sub(v, i + 1), 16), 0
  end
  if a and b and c then
    return a, b, c
  end
  return nil
end

-- pair reads a [dd] state; nil if v is not one.
local function pair(v)
  if type(v) ~= 'string' or #v ~= 16 then
    return nil
  end
  return sunpack('<dd', v)
end

-- Per rule of the request being decided: what it answers, and what it
-- writes if the request is admitted. Reused for every request.
local key, alg, cost, shadow, cap = {}, {}, {}, {}, {}
local ok, hrem, hreset, hretry, trem, treset, tdelay = {}, {}, {}, {}, {}, {}, {}
local wval, wttl, token = {}, {}, {}
local lat, lfresh, lrank, ltotal = {}, {}, {}, {}

local function fixed_window(i, W, L)
  local idx, n = (now - fmod(now, W)) / W, 0
  local w, c = hexes(pcall('GET', key[i]))
  if w and w >= idx then
    -- A later window than now's: the clock stepped back.
    idx, n = w, c
  end
  local ending = (idx + 1) * W - now
  hrem[i] = L - n
  if n > 0 then
    hreset[i] = ending
  end
  if cost[i] > cap[i] or n + cost[i] > L then
    hretry[i] = ending
    return
  end
  ok[i], trem[i], treset[i] = 1, L - n - cost[i], ending
  wval[i], wttl[i], token[i] = format('%x:%x', idx, n + cost[i]), ttl(ending), idx
end

-- counter_windows reads a sliding_window_counter state at time at.
local function counter_windows(at, W, w, n, p)
  local idx, cur, prev = (at - fmod(at, W)) / W, 0, 0
  if w then
    if w >= idx then
      idx, cur, prev = w, n, p
    elseif w == idx - 1 then
      prev = n
    end
  end
  return idx, cur, prev
end

local function counter_admits(at, W, L, c, w, n, p)
  local idx, cur, prev = counter_windows(at, W, w, n, p)
  local e = max(at - idx * W, 0)
  return prev * (W - e) / W + cur + c <= L
end

local function sliding_window_counter(i, W, L)
  local w, n, p = hexes(pcall('GET', key[i]))
  local idx, cur, prev = counter_windows(now, W, w, n, p)
  local e = max(now - idx * W, 0) -- elapsed in the current window
  local est = prev * (W - e) / W + cur
  local c = cost[i]
  hrem[i] = max(floor(L - est), 0)
  if cur > 0 then
    hreset[i] = 2 * W - e
  elseif prev > 0 then
    hreset[i] = W - e
  end
  if c > cap[i] then
    return
  elseif est + c <= L then
    ok[i], trem[i], treset[i] = 1, max(floor(L - est - c), 0), 2 * W - e
    wval[i], wttl[i], token[i] = format('%x:%x:%x', idx, cur + c, prev), ttl(2 * W - e), idx
    return
  end
  local wait
  if cur + c <= L then
    -- Only the previous window's weight must shrink.
    local at = W - (L - cur - c) * W / prev
    wait = max(ceil(at - e), 1)
  else
    -- Wait into the next window, where this window's count is the previous.
    local at = W - (L - c) * W / cur
    wait = W - e + max(ceil(at), 0)
  end
  for _ = 1, RETRY_STEPS do
    if counter_admits(now + wait, W, L, c, w, n, p) then
      break
    end
    wait = wait + 1
  end
  hretry[i] = wait
end

local function tokens_at(at, W, L, B, t, x)
  if not t then
    return B
  end
  return min(B, x + max(at - t, 0) * L / W)
end

local function token_bucket(i, W, L, B)
  local t, x = pair(pcall('GET', key[i]))
  local tokens = tokens_at(now, W, L, B, t, x)
  local c = cost[i]
  hrem[i] = floor(tokens)
  hreset[i] = time_for(B - tokens, W, L)
  if c > cap[i] then
    return
  end
  if tokens < c then
    local wait = time_for(c - tokens, W, L)
    for _ = 1, RETRY_STEPS do
      if tokens_at(now + wait, W, L, B, t, x) >= c then
        break
      end
      wait = wait + 1
    end
    hretry[i] = wait
    return
  end
  tokens = tokens - c
  ok[i], trem[i], treset[i] = 1, floor(tokens), time_for(B - tokens, W, L)
  wval[i], wttl[i], token[i] = spack('<dd', now, tokens), ttl(treset[i]), 0
end

local function level_at(at, W, L, t, x)
  if not t then
    return 0
  end
  return max(0, x - max(at - t, 0) * L / W)
end

local function leak_wait(level, c, W, L, B)
  local over = level + c - B
  if over <= 0 then
    return 0
  end
  return time_for(over, W, L)
end

local function leaky_bucket(i, W, L, B, D)
  local t, x = pair(pcall('GET', key[i]))
  local level = level_at(now, W, L, t, x)
  local c = cost[i]
  hrem[i] = max(floor(B - level), 0)
  hreset[i] = time_for(level, W, L)
  if c > cap[i] then
    return
  end
  local wait = leak_wait(level, c, W, L, B)
  if wait > D then
    local retry = wait - D
    for _ = 1, RETRY_STEPS do
      if leak_wait(level_at(now + retry, W, L, t, x), c, W, L, B) <= D then
        break
      end
      retry = retry + 1
    end
    hretry[i] = retry
    return
  end
  level = level + c
  ok[i], trem[i], treset[i], tdelay[i] = 1, max(floor(B - level), 0), time_for(level, W, L), wait
  wval[i], wttl[i], token[i] = spack('<dd', now, level), ttl(treset[i]), 0
end

local function sliding_window_log(i, W, L)
  local k, c = key[i], cost[i]
  local newest = pcall('ZRANGE', k, -1, -1, 'WITHSCORES')
  local total, before, rank, card = 0, 0, -1, 0
  local at = now
  lfresh[i] = true
  if type(newest) ~= 'table' or newest.err then
    lfresh[i] = 'replace' -- a key of another type
  elseif #newest > 0 then
    lfresh[i] = false
    total = tonumber(newest[1], 16)
    local ts = tonumber(newest[2])
    at = max(now, ts)
    -- The entry at or before the edge with the greatest time: the window
    -- holds what came after it.
    local edge = call('ZRANGE', k, format('%d', now - W), '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
    before = tonumber(edge[1], 16)
    rank = call('ZRANK', k, edge[1])
    card = call('ZCARD', k)
    if total - before > 0 then
      hreset[i] = ts + W - now
    end
  end
  local n = total - before
  hrem[i] = L - n
  if c > cap[i] then
    return
  elseif n + c > L then
    -- The oldest entries must leave until the request fits: find the first
    -- whose total frees enough, by binary search on rank.
    local want = before + n + c - L
    local lo, hi = rank + 1, card - 1
    while lo < hi do
      local mid = floor((lo + hi) / 2)
      if tonumber(call('ZRANGE', k, mid, mid)[1], 16) >= want then
        hi = mid
      else
        lo = mid + 1
      end
    end
    hretry[i] = tonumber(call('ZRANGE', k, lo, lo, 'WITHSCORES')[2]) + W - now
    return
  end
  ok[i], trem[i], treset[i] = 1, L - n - c, at + W - now
  lat[i], lrank[i], ltotal[i] = at, rank, total + c
  wttl[i], token[i] = ttl(at + W - now), total + c
end

local function write_log(i)
  local k = key[i]
  if lfresh[i] == 'replace' then
    call('DEL', k)
  end
  local total = ltotal[i]
  if lfresh[i] then
    call('ZADD', k, '-inf', '00000000000000')
  elseif total >= REBASE then
    -- Restart the totals from the kept edge entry: rewrite the window.
    local kept = call('ZRANGE', k, lrank[i], -1, 'WITHSCORES')
    local base = tonumber(kept[1], 16)
    call('DEL', k)
    call('ZADD', k, '-inf', '00000000000000')
    for j = 3, #kept, 2 do
      call('ZADD', k, kept[j + 1], format('%014x', tonumber(kept[j], 16) - base))
    end
    total = total - base
    lrank[i] = 0
  end
  call('ZADD', k, format('%d', lat[i]), format('%014x', total))
  call('PEXPIRE', k, wttl[i])
  if lrank[i] > 0 then
    call('ZREMRANGEBYRANK', k, 0, min(lrank[i], SWEEP) - 1)
  end
end

local reply = {}
for _ = 1, nreq do
  local nrules
  nrules, pos = sunpack('<B', blob, pos)
  local all = 1
  -- Phase one: every rule decides without writing.
  for i = 1, nrules do
    local id, sh
    id, sh, cost[i], key[i], pos = sunpack('<HBdHc0', blob, pos)
    local a, W, L = PA[id], PW[id], PL[id]
    alg[i], shadow[i], cap[i] = a, sh == 1, PM[id]
    ok[i], hrem[i], hreset[i], hretry[i], tdelay[i], token[i] = 0, 0, 0, 0, 0, 0
    if a == 1 then
      fixed_window(i, W, L)
    elseif a == 2 then
      sliding_window_log(i, W, L)
    elseif a == 3 then
      sliding_window_counter(i, W, L)
    elseif a == 4 then
      token_bucket(i, W, L, PB[id])
    else -- leaky_bucket, and gcra, which is one with it (see algo/eval.go)
      leaky_bucket(i, W, L, PB[id], PD[id])
    end
    if ok[i] == 0 and not shadow[i] then
      all = 0
    end
  end
  -- Phase two: only if the request is admitted, write, and answer with the
  -- counts after consuming; otherwise answer with the counts as they stand.
  reply[#reply + 1] = spack('<B', all)
  for i = 1, nrules do
    local reason, rem, reset, retry, delay = 0, hrem[i], hreset[i], hretry[i], 0
    if cost[i] > cap[i] then
      reason, retry = 2, 0
    elseif ok[i] == 0 then
      reason = 1
    elseif all == 1 then
      if alg[i] == 2 then
        write_log(i)
      else
        call('SET', key[i], wval[i], 'PX', wttl[i])
      end
      rem, reset, delay = trem[i], treset[i], tdelay[i]
    end
    if tokens_wanted then
      reply[#reply + 1] = spack('<BBddddd', ok[i], reason, rem, reset, retry, delay, token[i])
    else
      reply[#reply + 1] = spack('<BBdddd', ok[i], reason, rem, reset, retry, delay)
    end
  end
end
return table.concat(reply)
