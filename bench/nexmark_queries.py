"""Nexmark for both engines: a deterministic event generator and the queries Structured
Streaming can express.

The generator is a ``rate-micro-batch`` stream turned into Nexmark events by column
expressions, so the executors generate the data on either engine and batch *b* holds the
same rows on both: event number ``value`` (``rowsPerBatch`` = R events per batch), event
time ``date_time = base + value * span / R`` (a batch spans ``span`` of event time: one
second in the benchmark, i.e. R events per second of event time at a 1 s trigger), and
every random choice a pure function of ``value`` (``xxhash64(value, salt)``).

The rules follow the ``nexmark/nexmark`` repository's generator (``GeneratorConfig``,
``PersonGenerator``, ``AuctionGenerator``, ``BidGenerator``, ``PriceGenerator``):

* of every 50 events, 1 is a person, 3 are auctions, 46 are bids (2% / 6% / 92%);
  person ids are ``1000 + epoch``, auction ids ``1000 + 3 * epoch + k`` (epoch =
  ``value // 50``);
* a bid's auction is the current "hot" auction (``last // 2 * 2``) half of the time,
  otherwise one of the last 100 auctions or up to 10 not yet created; its bidder is a hot
  bidder (``last_person // 4 * 4 + 1``) 3 times in 4, otherwise one of the last 1000
  persons or up to 10 not yet created; an auction's seller likewise (hot: 3 in 4);
* prices are ``round(10 ** (6 u) * 100)`` (cents), reserve = initial bid + a price;
  categories ``10 .. 14``; persons' states from ``AZ CA ID OR WA WY``;
* an auction expires ``1 + u * 2 h`` after it starts, where ``h`` is the event time the
  next 100 auctions take to arrive (``100 * 50 / 3`` events): Nexmark's rule that about
  100 auctions are in flight;
* ``extra`` pads bids, auctions and persons to about Nexmark's average sizes (100, 500
  and 200 bytes).

The queries take the nexmark/nexmark definitions (``queries/*.sql``), rewritten where
Structured Streaming needs it (joins bounded in event time with watermarks, chained
aggregations as windows in append mode); each builder's docstring says how. Not here:
q6 and q9 (OVER / ROW_NUMBER over a stream), q10 and q12 (file sink by processing time,
processing-time windows), q15 and q16 (COUNT DISTINCT), q18 and q19 (ROW_NUMBER top-N):
Structured Streaming refuses them on either engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

# nexmark/nexmark GeneratorConfig defaults
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_AUCTION_RATIO = 2
HOT_BIDDER_RATIO = 4
HOT_SELLER_RATIO = 4
IN_FLIGHT_AUCTIONS = 100
ACTIVE_PEOPLE = 1000
AUCTION_ID_LEAD = 10
PERSON_ID_LEAD = 10
US_STATES = ["AZ", "CA", "ID", "OR", "WA", "WY"]
US_CITIES = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne"]
FIRST_NAMES = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"]
LAST_NAMES = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"]
CHANNELS = ["Google", "Facebook", "Baidu", "Apple"]
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: event time of event 0


@dataclass(frozen=True)
class Config:
    """The stream's shape: R events per batch, ``span_ms`` of event time per batch, and the
    queries' windows (Nexmark's: 10 s windows, 2 s slide, 10 s session gap)."""

    rows_per_batch: int = 10_000
    span_ms: int = 1_000
    window_s: int = 10
    slide_s: int = 2
    session_gap_s: int = 10
    watermark_s: int = 0
    """Watermark delay: events arrive in event-time order, so 0 drops nothing."""
    q2_modulus: int = 123
    in_flight_auctions: int = IN_FLIGHT_AUCTIONS
    """Nexmark's ``numInFlightAuctions``: which auctions bids pick, and how long auctions last."""
    num_partitions: int | None = None

    def events_ms(self, events: int) -> int:
        """The event time ``events`` events take, in whole milliseconds (at least 1)."""
        return max(1, events * self.span_ms // self.rows_per_batch)

    @property
    def max_auction_ms(self) -> int:
        """The longest an auction lasts: ``1 + 2 h`` (see the module docstring)."""
        horizon = self.events_ms(self.in_flight_auctions * TOTAL // AUCTION_PROPORTION)
        return 2 * horizon + 1


# -- the generator ---------------------------------------------------------------------------
def _u(salt: int) -> Column:
    """A uniform double in [0, 1), a pure function of the event number and ``salt``."""
    return F.pmod(F.xxhash64(F.col("value"), F.lit(salt)), F.lit(1 << 53)).cast("double") / float(1 << 53)


def _int(salt: int, n: Column | int) -> Column:
    """A uniform long in [0, n)."""
    n = n if isinstance(n, Column) else F.lit(n)
    return F.pmod(F.xxhash64(F.col("value"), F.lit(salt)), n.cast("long"))


def _pick(salt: int, items: list[str]) -> Column:
    return F.element_at(F.array(*[F.lit(x) for x in items]), (_int(salt, len(items)) + 1).cast("int"))


def _price(salt: int) -> Column:
    return F.round(F.pow(F.lit(10.0), _u(salt) * 6.0) * 100.0).cast("long")


def _pad(base: Column, size: int, salt: int) -> Column:
    """Nexmark's ``extra``: pad to about ``size`` bytes."""
    return F.rpad(F.concat(base, F.lit(":"), F.hex(F.xxhash64(F.col("value"), F.lit(salt)))), size, "x")


def _epoch() -> Column:
    return F.floor(F.col("value") / TOTAL)


def _last_person() -> Column:
    return _epoch()  # PERSON_PROPORTION == 1


def _next_person(salt: int) -> Column:
    """An active person or one of the next few: ``numPeople - active + rand(active + lead)``."""
    num = _last_person() + 1
    active = F.least(num, F.lit(ACTIVE_PEOPLE))
    return num - active + _int(salt, active + PERSON_ID_LEAD)


def _last_auction() -> Column:
    offset = F.col("value") % TOTAL
    epoch = _epoch()
    return (
        F.when(offset < PERSON_PROPORTION, (epoch - 1) * AUCTION_PROPORTION + AUCTION_PROPORTION - 1)
        .when(offset < PERSON_PROPORTION + AUCTION_PROPORTION, epoch * AUCTION_PROPORTION + offset - PERSON_PROPORTION)
        .otherwise(epoch * AUCTION_PROPORTION + AUCTION_PROPORTION - 1)
    )


def _next_auction(salt: int, cfg: Config) -> Column:
    last = _last_auction()
    low = F.greatest(last - cfg.in_flight_auctions, F.lit(0))
    return low + _int(salt, last - low + 1 + AUCTION_ID_LEAD)


def _date_time(cfg: Config) -> Column:
    us = F.lit(BASE_MS * 1000) + F.floor(F.col("value") * (cfg.span_ms * 1000) / cfg.rows_per_batch)
    return F.timestamp_micros(us.cast("long"))


def events(readers: Callable[[], Any], cfg: Config) -> Any:
    """The rate stream with the event's kind and time; ``bids``/``auctions``/``persons``
    select their rows and columns."""
    reader = readers().format("rate-micro-batch").option("rowsPerBatch", cfg.rows_per_batch)
    if cfg.num_partitions:
        reader = reader.option("numPartitions", cfg.num_partitions)
    offset = F.col("value") % TOTAL
    kind = (
        F.when(offset < PERSON_PROPORTION, F.lit(0))
        .when(offset < PERSON_PROPORTION + AUCTION_PROPORTION, F.lit(1))
        .otherwise(F.lit(2))
    )
    return reader.load().select(F.col("value"), kind.alias("event_type"), _date_time(cfg).alias("date_time"))


def bids(readers: Callable[[], Any], cfg: Config) -> Any:
    hot_auction = F.floor(_last_auction() / HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
    auction = F.when(_int(1, HOT_AUCTION_RATIO) > 0, hot_auction).otherwise(_next_auction(2, cfg))
    hot_bidder = F.floor(_last_person() / HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
    bidder = F.when(_int(3, HOT_BIDDER_RATIO) > 0, hot_bidder).otherwise(_next_person(4))
    channel_no = _int(6, 10_000)
    channel = F.when(channel_no < len(CHANNELS), F.element_at(
        F.array(*[F.lit(c) for c in CHANNELS]), (channel_no + 1).cast("int"))
    ).otherwise(F.concat(F.lit("channel-"), channel_no.cast("string")))
    url = F.concat(F.lit("https://www.nexmark.com/"), F.hex(_int(7, 1 << 30)), F.lit("/item.htm?query=1&channel_id="),
                   channel_no.cast("string"))
    return events(readers, cfg).where(F.col("event_type") == 2).select(
        (auction + FIRST_AUCTION_ID).cast("long").alias("auction"),
        (bidder + FIRST_PERSON_ID).cast("long").alias("bidder"),
        _price(5).alias("price"),
        channel.alias("channel"),
        url.alias("url"),
        F.col("date_time"),
        _pad(F.lit("bid"), 40, 8).alias("extra"),
    )


def auctions(readers: Callable[[], Any], cfg: Config) -> Any:
    epoch = _epoch()
    aid = epoch * AUCTION_PROPORTION + (F.col("value") % TOTAL) - PERSON_PROPORTION + FIRST_AUCTION_ID
    hot_seller = F.floor(_last_person() / HOT_SELLER_RATIO) * HOT_SELLER_RATIO
    seller = F.when(_int(11, HOT_SELLER_RATIO) > 0, hot_seller).otherwise(_next_person(12))
    initial = _price(13)
    lifetime_us = (1 + _u(14) * (cfg.max_auction_ms - 1)) * 1000
    return events(readers, cfg).where(F.col("event_type") == 1).select(
        aid.cast("long").alias("id"),
        F.concat(F.lit("item-"), _int(15, 1 << 20).cast("string")).alias("itemName"),
        F.concat(F.lit("description of item "), _int(16, 1 << 20).cast("string")).alias("description"),
        initial.alias("initialBid"),
        (initial + _price(17)).alias("reserve"),
        F.col("date_time"),
        F.timestamp_micros(
            (F.unix_micros(F.col("date_time")) + F.floor(lifetime_us)).cast("long")
        ).alias("expires"),
        (seller + FIRST_PERSON_ID).cast("long").alias("seller"),
        (_int(18, NUM_CATEGORIES) + FIRST_CATEGORY_ID).alias("category"),
        _pad(F.lit("auction"), 400, 19).alias("extra"),
    )


def persons(readers: Callable[[], Any], cfg: Config) -> Any:
    name = F.concat(_pick(21, FIRST_NAMES), F.lit(" "), _pick(22, LAST_NAMES))
    return events(readers, cfg).where(F.col("event_type") == 0).select(
        (_epoch() + FIRST_PERSON_ID).cast("long").alias("id"),
        name.alias("name"),
        F.concat(F.lower(F.regexp_replace(name, " ", ".")), F.lit("@"), _int(23, 1000).cast("string"),
                 F.lit(".com")).alias("emailAddress"),
        F.format_string("%04d %04d %04d %04d", _int(24, 10000), _int(25, 10000), _int(26, 10000),
                        _int(27, 10000)).alias("creditCard"),
        _pick(28, US_CITIES).alias("city"),
        _pick(29, US_STATES).alias("state"),
        F.col("date_time"),
        _pad(F.lit("person"), 120, 30).alias("extra"),
    )


# -- the queries -----------------------------------------------------------------------------
def _wm(df: Any, col: str, cfg: Config) -> Any:
    return df.withWatermark(col, f"{cfg.watermark_s} seconds")


def _interval_ms(ms: int) -> Column:
    return F.expr(f"INTERVAL {ms / 1000:.3f} SECONDS")


def q0(readers: Callable[[], Any], cfg: Config) -> Any:
    """Pass-through: every bid, every column."""
    return bids(readers, cfg)


def q1(readers: Callable[[], Any], cfg: Config) -> Any:
    """Currency conversion: ``price * 0.908`` (dollars to euros)."""
    b = bids(readers, cfg)
    return b.select("auction", "bidder", (F.col("price") * 0.908).alias("price"), "date_time", "extra")


def q2(readers: Callable[[], Any], cfg: Config) -> Any:
    """Selection: bids on auctions whose id is a multiple of 123."""
    return bids(readers, cfg).where(F.col("auction") % cfg.q2_modulus == 0).select("auction", "price")


def q3(readers: Callable[[], Any], cfg: Config) -> Any:
    """Local item suggestion: persons in OR/ID/CA selling in category 10. Nexmark's join is
    unbounded; rewritten with watermarks and the auction within 10 windows (100 s) after
    the seller registered, so that state stays bounded."""
    a = _wm(auctions(readers, cfg).where(F.col("category") == 10), "date_time", cfg).select(
        F.col("id"), F.col("seller"), F.col("date_time").alias("a_time"))
    p = _wm(persons(readers, cfg).where(F.col("state").isin("OR", "ID", "CA")), "date_time", cfg).select(
        F.col("id").alias("p_id"), "name", "city", "state", F.col("date_time").alias("p_time"))
    cond = ((F.col("seller") == F.col("p_id")) & (F.col("a_time") >= F.col("p_time"))
            & (F.col("a_time") <= F.col("p_time") + F.expr(f"INTERVAL {10 * cfg.window_s} SECONDS")))
    return a.join(p, cond, "inner").select("name", "city", "state", "id")


def _winning_bids(readers: Callable[[], Any], cfg: Config) -> Any:
    """Bids within their auction's lifetime: auction join bid on id, bounded by the longest
    auction so that both sides' state is evicted by the watermarks."""
    a = _wm(auctions(readers, cfg), "date_time", cfg).select(
        "id", "category", "seller", F.col("date_time").alias("a_time"), "expires")
    b = _wm(bids(readers, cfg), "date_time", cfg).select("auction", "price", F.col("date_time").alias("b_time"))
    cond = ((F.col("id") == F.col("auction")) & (F.col("b_time") >= F.col("a_time"))
            & (F.col("b_time") <= F.col("a_time") + _interval_ms(cfg.max_auction_ms))
            & (F.col("b_time") <= F.col("expires")))
    return a.join(b, cond, "inner")


def q4(readers: Callable[[], Any], cfg: Config) -> Any:
    """Average winning price per category. Nexmark: max bid per closed auction, then the
    average per category. Rewrite (chained aggregations in append mode): the max per
    auction in the window of its start, then the average per category of those maxima per
    window."""
    w = f"{cfg.window_s} seconds"
    per_auction = _winning_bids(readers, cfg).groupBy(
        F.window("a_time", w), "id", "category").agg(F.max("price").alias("final"))
    return per_auction.groupBy(F.window(F.window_time("window"), w), "category").agg(
        F.avg("final").alias("avg_final"))


def q5(readers: Callable[[], Any], cfg: Config) -> Any:
    """Hot items: the auction with the most bids per sliding window (10 s, every 2 s).
    Rewrite (chained windows in append mode): bids per auction per sliding window, then
    the top one per window (ties: the larger auction id)."""
    counts = _wm(bids(readers, cfg), "date_time", cfg).groupBy(
        F.window("date_time", f"{cfg.window_s} seconds", f"{cfg.slide_s} seconds"), "auction").count()
    top = counts.groupBy(F.window(F.window_time("window"), f"{cfg.slide_s} seconds")).agg(
        F.max(F.struct("count", "auction")).alias("top"))
    return top.select(F.col("window.end").alias("window_end"), F.col("top.auction").alias("auction"),
                      F.col("top.count").alias("num"))


def q7(readers: Callable[[], Any], cfg: Config) -> Any:
    """Highest bid per 10 s window. Nexmark joins the bids back to the window's max price;
    rewritten as one aggregation of ``max(struct(price, auction, bidder))`` (the same rows,
    ties broken by the larger auction and bidder)."""
    top = _wm(bids(readers, cfg), "date_time", cfg).groupBy(F.window("date_time", f"{cfg.window_s} seconds")).agg(
        F.max(F.struct("price", "auction", "bidder")).alias("top"))
    return top.select(F.col("window.end").alias("window_end"), "top.auction", "top.price", "top.bidder")


def q8(readers: Callable[[], Any], cfg: Config) -> Any:
    """New users: persons who registered and opened an auction in the same 10 s window (a
    windowed stream-stream join on id = seller and the window)."""
    w = f"{cfg.window_s} seconds"
    p = _wm(persons(readers, cfg), "date_time", cfg).select(
        F.col("id"), F.col("name"), F.window("date_time", w).alias("p_window"))
    a = _wm(auctions(readers, cfg), "date_time", cfg).select(
        F.col("seller"), F.window("date_time", w).alias("a_window"))
    cond = (F.col("id") == F.col("seller")) & (F.col("p_window") == F.col("a_window"))
    return p.join(a, cond, "inner").select("id", "name", F.col("p_window.start").alias("starttime"))


def q11(readers: Callable[[], Any], cfg: Config) -> Any:
    """User sessions: bids per bidder per session (10 s gap)."""
    return _wm(bids(readers, cfg), "date_time", cfg).groupBy(
        "bidder", F.session_window("date_time", f"{cfg.session_gap_s} seconds")).count().select(
        "bidder", F.col("count").alias("bid_count"), F.col("session_window.start").alias("starttime"),
        F.col("session_window.end").alias("endtime"))


def q13(readers: Callable[[], Any], cfg: Config) -> Any:
    """Bounded side input join: every bid joined to a static table (``auction % 10000``)."""
    spark = _active_spark()
    side = spark.range(10_000).select(F.col("id").alias("key"), F.concat(F.lit("side-"), F.col("id")).alias("value"))
    b = bids(readers, cfg)
    return b.join(side, (b["auction"] % 10_000) == side["key"], "inner").select(
        "auction", "bidder", "price", "date_time", "value")


def q14(readers: Callable[[], Any], cfg: Config) -> Any:
    """Calculation: converted price within a range, the time of day as a label and the
    number of 'c' in ``extra``."""
    hour = F.hour("date_time")
    kind = (F.when((hour >= 8) & (hour <= 18), "dayTime")
            .when((hour <= 6) | (hour >= 20), "nightTime").otherwise("otherTime"))
    price = F.col("price") * 0.908
    return bids(readers, cfg).where((price > 1_000_000) & (price < 50_000_000)).select(
        "auction", "bidder", price.alias("price"), kind.alias("bidTimeType"), "date_time", "extra",
        (F.length("extra") - F.length(F.regexp_replace("extra", "c", ""))).alias("c_counts"))


def q17(readers: Callable[[], Any], cfg: Config) -> Any:
    """Auction statistics per 10 s window (Nexmark: per day): bid count, count by price
    band, min, max, avg and sum of prices per auction."""
    p = F.col("price")
    return _wm(bids(readers, cfg), "date_time", cfg).groupBy(
        F.window("date_time", f"{cfg.window_s} seconds"), "auction").agg(
        F.count(F.lit(1)).alias("total_bids"),
        F.count(F.when(p < 10_000, 1)).alias("rank1_bids"),
        F.count(F.when((p >= 10_000) & (p < 1_000_000), 1)).alias("rank2_bids"),
        F.count(F.when(p >= 1_000_000, 1)).alias("rank3_bids"),
        F.min(p).alias("min_price"), F.max(p).alias("max_price"),
        F.avg(p).alias("avg_price"), F.sum(p).alias("sum_price"))


def q20(readers: Callable[[], Any], cfg: Config) -> Any:
    """Expand bid with auction: bids of category-10 auctions with the auction's columns
    (bounded by the auction's lifetime, as in q4)."""
    a = _wm(auctions(readers, cfg).where(F.col("category") == 10), "date_time", cfg).select(
        "id", "itemName", "description", "initialBid", "reserve", F.col("date_time").alias("a_time"),
        "expires", "seller", "category")
    b = _wm(bids(readers, cfg), "date_time", cfg).select(
        "auction", "bidder", "price", "channel", "url", F.col("date_time").alias("b_time"))
    cond = ((F.col("id") == F.col("auction")) & (F.col("b_time") >= F.col("a_time"))
            & (F.col("b_time") <= F.col("a_time") + _interval_ms(cfg.max_auction_ms)))
    return b.join(a, cond, "inner")


def q21(readers: Callable[[], Any], cfg: Config) -> Any:
    """Add channel id: a case over the channel, else the ``channel_id`` of the url."""
    ch = F.lower(F.col("channel"))
    cid = (F.when(ch == "apple", "0").when(ch == "google", "1").when(ch == "facebook", "2")
           .when(ch == "baidu", "3").otherwise(F.regexp_extract("url", r"(&|^)channel_id=([^&]*)", 2)))
    return bids(readers, cfg).select("auction", "bidder", "price", "channel", cid.alias("channel_id")).where(
        F.col("channel_id") != "")


def q22(readers: Callable[[], Any], cfg: Config) -> Any:
    """Get URL directories: the url split on '/'."""
    parts = F.split(F.col("url"), "/")
    return bids(readers, cfg).select("auction", "bidder", "price", "channel",
                                     parts[3].alias("dir1"), parts[4].alias("dir2"))


def _active_spark() -> Any:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise RuntimeError("q13 needs an active SparkSession for its side input")
    return spark


@dataclass(frozen=True)
class Query:
    name: str
    build: Callable[[Callable[[], Any], Config], Any]
    inputs: int = 1
    """rate streams read: a batch's ``numInputRows`` is ``inputs * R``."""
    output_mode: str = "append"
    stateful: bool = False

    @property
    def title(self) -> str:
        return (self.build.__doc__ or "").split(".")[0].split(":")[0].strip()


QUERIES: dict[str, Query] = {
    q.name: q
    for q in [
        Query("q0", q0),
        Query("q1", q1),
        Query("q2", q2),
        Query("q3", q3, inputs=2, stateful=True),
        Query("q4", q4, inputs=2, stateful=True),
        Query("q5", q5, stateful=True),
        Query("q7", q7, stateful=True),
        Query("q8", q8, inputs=2, stateful=True),
        Query("q11", q11, stateful=True),
        Query("q13", q13),
        Query("q14", q14),
        Query("q17", q17, stateful=True),
        Query("q20", q20, inputs=2, stateful=True),
        Query("q21", q21),
        Query("q22", q22),
    ]
}


def select(spec: str | None) -> list[str]:
    """``"q1,5"`` -> ``["q1", "q5"]``; ``None``/``"all"`` -> every query."""
    if not spec or spec == "all":
        return list(QUERIES)
    chosen = []
    for part in spec.split(","):
        part = part.strip().lower()
        if not part:
            continue
        name = part if part.startswith("q") else f"q{part}"
        if name not in QUERIES:
            raise ValueError(f"unknown Nexmark query {part!r}; known: {', '.join(QUERIES)}")
        if name not in chosen:
            chosen.append(name)
    return chosen
