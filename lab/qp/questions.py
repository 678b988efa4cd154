"""Seeded generator of the planner's training and calibration questions, each with its plan.

Why generated: the planner must learn conventions (what is a price cap, which words are a
brand, keyword vs sentence) across many surface forms, and a 135M model needs thousands of
examples to stop copying the nearest template. Everything here is slot lists and phrasing
patterns; the hand-written held-out set (data/qp/eval.jsonl) shares no sentence with it.

Labelling conventions (the eval set is labelled by the same rules):

* ``max_price`` only for an upper bound the customer states ("under $50", "50 bucks or
  less", "my budget is £30"); numbers that are sizes or specs ("65 inch", "20v max",
  "sleeps 4", "a 10 year old", order numbers) are not prices.
* ``brand`` (lower case, as written) only when the customer restricts a product search,
  question or recommendation to one brand named in the question or the history; never for
  comparisons, orders, returns or off-topic questions, and never inferred from a model name
  that does not contain it ("iphone 15" has no brand filter).
* ``query_type``: ``keyword`` for noun phrases ("sony headphones under $100", "best tent
  for camping"), ``conversational`` for sentences and requests ("i'm looking for...").
* ``search_queries``: the product words (brand, attributes, spec numbers kept; price words,
  typos and filler removed); one per product in a comparison; "<item> order" / "<item>
  return" for orders and returns ("order status", "return policy" without an item); the
  question itself for off-topic questions. Follow-ups take the product from the history.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (category, product nouns, brands, attribute prefixes, attribute suffixes incl. spec numbers)
CATEGORIES: list[tuple[str, list[str], list[str], list[str], list[str]]] = [
    (
        "tv",
        ["tv", "smart tv", "oled tv", "television", "projector"],
        ["samsung", "lg", "sony", "tcl", "hisense", "vizio"],
        ["65 inch", "55 inch", "43 inch", "4k", "75 inch", "32 inch"],
        ["with hdmi 2.1", "for gaming", "120hz"],
    ),
    (
        "audio",
        [
            "headphones",
            "wireless earbuds",
            "earbuds",
            "bluetooth speaker",
            "soundbar",
            "over ear headphones",
        ],
        ["sony", "bose", "jbl", "beats", "sennheiser", "anker", "skullcandy", "sonos"],
        ["noise cancelling", "wireless", "waterproof", "open ear"],
        ["for running", "with mic", "for the gym"],
    ),
    (
        "laptop",
        ["laptop", "gaming laptop", "chromebook", "tablet", "2 in 1 laptop"],
        ["lenovo", "dell", "hp", "asus", "acer", "apple", "microsoft", "msi"],
        ["15.6 inch", "14 inch", "lightweight", "16gb ram"],
        ["for college", "for video editing", "with 1tb ssd", "for kids"],
    ),
    (
        "power tools",
        [
            "cordless drill",
            "impact driver",
            "drill set",
            "circular saw",
            "leaf blower",
            "pressure washer",
        ],
        [
            "dewalt",
            "makita",
            "milwaukee",
            "ryobi",
            "bosch",
            "black and decker",
            "ego",
            "greenworks",
        ],
        ["20v max", "18v", "brushless", "40v", "12v"],
        ["with battery", "kit", "with charger"],
    ),
    (
        "camping",
        [
            "tent",
            "camping tent",
            "sleeping bag",
            "backpacking tent",
            "camping chair",
            "cooler",
            "headlamp",
        ],
        ["coleman", "rei", "marmot", "kelty", "yeti", "black diamond"],
        ["waterproof", "lightweight", "2 person", "6 person", "20 degree"],
        ["sleeps 4", "sleeps 6", "for backpacking"],
    ),
    (
        "shoes",
        [
            "running shoes",
            "trail running shoes",
            "sneakers",
            "walking shoes",
            "hiking boots",
            "sandals",
        ],
        ["nike", "adidas", "asics", "brooks", "hoka", "new balance", "saucony", "merrell"],
        ["women's", "men's", "wide", "waterproof"],
        ["size 10", "size 8.5", "for flat feet", "in size 11"],
    ),
    (
        "vacuum",
        ["vacuum", "robot vacuum", "cordless vacuum", "stick vacuum", "carpet cleaner"],
        ["dyson", "shark", "bissell", "irobot", "eufy", "hoover"],
        ["cordless", "bagless", "self emptying"],
        ["for pet hair", "for hardwood floors", "for stairs"],
    ),
    (
        "coffee",
        ["coffee maker", "espresso machine", "coffee grinder", "french press", "kettle"],
        ["breville", "keurig", "nespresso", "cuisinart", "delonghi", "hamilton beach", "bodum"],
        ["12 cup", "single serve", "programmable", "burr"],
        ["with milk frother", "with grinder"],
    ),
    (
        "kitchen",
        [
            "blender",
            "food processor",
            "stand mixer",
            "air fryer",
            "slow cooker",
            "toaster oven",
            "knife set",
            "cast iron skillet",
            "rice cooker",
        ],
        [
            "ninja",
            "vitamix",
            "kitchenaid",
            "cuisinart",
            "instant pot",
            "cosori",
            "lodge",
            "zojirushi",
        ],
        ["6 quart", "5.8 qt", "1000 watt", "10 inch", "3 cup"],
        ["dishwasher safe", "with glass jar"],
    ),
    (
        "phone",
        [
            "phone",
            "smartphone",
            "phone case",
            "screen protector",
            "phone charger",
            "power bank",
            "usb c cable",
        ],
        ["apple", "samsung", "google", "otterbox", "anker", "spigen", "belkin"],
        ["128gb", "256gb", "unlocked", "fast charging", "10000mah", "6 ft"],
        ["with magsafe", "for iphone 15"],
    ),
    (
        "wearables",
        ["smart watch", "fitness tracker", "running watch", "watch band"],
        ["garmin", "fitbit", "apple", "samsung", "amazfit", "polar"],
        ["44mm", "41mm", "gps"],
        ["with heart rate monitor", "for swimming", "with sleep tracking"],
    ),
    (
        "computer",
        [
            "monitor",
            "gaming monitor",
            "mechanical keyboard",
            "wireless mouse",
            "gaming mouse",
            "webcam",
            "desk chair",
            "standing desk",
        ],
        ["dell", "lg", "asus", "benq", "logitech", "razer", "corsair", "keychron", "herman miller"],
        ["27 inch", "144hz", "32 inch", "1440p", "ergonomic", "quiet"],
        ["for mac", "with usb c", "for programming"],
    ),
    (
        "toys",
        [
            "lego set",
            "board game",
            "jigsaw puzzle",
            "action figure",
            "stuffed animal",
            "drone",
            "remote control car",
        ],
        ["lego", "hasbro", "mattel", "ravensburger", "fisher price", "dji"],
        ["1000 piece", "educational", "2 player"],
        ["for ages 8+", "for toddlers", "for adults"],
    ),
    (
        "beauty",
        [
            "moisturizer",
            "sunscreen",
            "shampoo",
            "hair dryer",
            "electric toothbrush",
            "electric razor",
            "face wash",
        ],
        [
            "cerave",
            "neutrogena",
            "olaplex",
            "dyson",
            "philips",
            "oral-b",
            "braun",
            "la roche-posay",
        ],
        ["spf 50", "fragrance free", "8 oz"],
        ["for sensitive skin", "for curly hair", "for oily skin"],
    ),
    (
        "home",
        [
            "mattress",
            "pillow",
            "bed sheets",
            "comforter",
            "bookshelf",
            "area rug",
            "blackout curtains",
            "air purifier",
            "space heater",
            "fan",
        ],
        ["casper", "tempur-pedic", "ikea", "brooklinen", "levoit", "honeywell", "dyson"],
        ["queen size", "king size", "500 thread count", "8x10", "memory foam"],
        ["for back pain", "for bedroom", "for allergies"],
    ),
    (
        "outdoor",
        [
            "backpack",
            "rain jacket",
            "water bottle",
            "winter jacket",
            "fleece",
            "hiking backpack",
            "trekking poles",
        ],
        ["north face", "patagonia", "columbia", "osprey", "hydro flask", "arcteryx", "yeti"],
        ["40l", "32 oz", "insulated", "packable"],
        ["for hiking", "for travel", "for women"],
    ),
    (
        "pets",
        [
            "dog food",
            "dog bed",
            "cat litter",
            "cat tree",
            "dog leash",
            "dog toys",
            "cat food",
            "aquarium",
        ],
        ["purina", "blue buffalo", "kong", "hill's", "greenies", "tetra"],
        ["30 lb", "grain free", "orthopedic", "10 gallon"],
        ["for large dogs", "for puppies", "for senior cats"],
    ),
    (
        "baby",
        ["stroller", "car seat", "baby monitor", "diapers", "high chair", "baby carrier"],
        ["graco", "chicco", "uppababy", "pampers", "huggies", "nanit"],
        ["lightweight", "convertible", "size 3"],
        ["for newborns", "for travel"],
    ),
    (
        "gaming",
        ["gaming console", "controller", "gaming headset", "video game", "gaming chair"],
        ["nintendo", "playstation", "xbox", "steelseries", "hyperx", "turtle beach", "secretlab"],
        ["wireless", "7.1"],
        ["for ps5", "for pc", "for switch"],
    ),
    (
        "camera",
        [
            "camera",
            "mirrorless camera",
            "action camera",
            "security camera",
            "doorbell camera",
            "dash cam",
            "tripod",
        ],
        ["canon", "nikon", "sony", "gopro", "ring", "arlo", "wyze", "fujifilm"],
        ["4k", "1080p", "outdoor", "wireless"],
        ["for vlogging", "with night vision", "for beginners"],
    ),
    (
        "grill",
        ["grill", "gas grill", "pellet grill", "smoker", "pizza oven", "griddle"],
        ["weber", "traeger", "char-broil", "pit boss", "ooni", "blackstone"],
        ["3 burner", "portable", "36 inch"],
        ["for camping", "with cover"],
    ),
    (
        "appliances",
        [
            "washing machine",
            "dishwasher",
            "microwave",
            "refrigerator",
            "dehumidifier",
            "mini fridge",
            "chest freezer",
        ],
        ["lg", "samsung", "whirlpool", "ge", "frigidaire", "bosch"],
        ["50 pint", "1.1 cu ft", "stainless steel", "front load", "compact"],
        ["for basement", "for dorm"],
    ),
    (
        "clothes",
        ["jeans", "winter coat", "hoodie", "dress", "t-shirts", "leggings", "rain boots", "socks"],
        ["levi's", "carhartt", "lululemon", "uniqlo", "champion", "patagonia", "hunter"],
        ["size large", "32x30", "cotton", "wool", "black"],
        ["for women", "for men", "for work"],
    ),
    (
        "tools",
        [
            "tool set",
            "socket set",
            "ladder",
            "lawn mower",
            "tape measure",
            "stud finder",
            "garden hose",
        ],
        ["craftsman", "stanley", "werner", "greenworks", "klein", "milwaukee"],
        ["100 ft", "6 ft", "cordless", "230 piece"],
        ["for beginners", "with case"],
    ),
]

# Specific models (brand or None when the name does not contain the brand), per category.
MODELS: dict[str, list[tuple[str | None, str]]] = {
    "tv": [
        ("lg", "lg c3 oled"),
        ("samsung", "samsung s90c"),
        ("sony", "sony bravia x90l"),
        ("tcl", "tcl 6 series"),
        ("hisense", "hisense u8"),
    ],
    "audio": [
        ("sony", "sony wh-1000xm5"),
        ("bose", "bose quietcomfort ultra"),
        (None, "airpods pro 2"),
        ("jbl", "jbl flip 6"),
        (None, "galaxy buds 2 pro"),
        ("sonos", "sonos era 100"),
        ("beats", "beats studio pro"),
    ],
    "laptop": [
        (None, "macbook air m2"),
        ("dell", "dell xps 13"),
        (None, "thinkpad x1 carbon"),
        (None, "ipad air"),
        ("hp", "hp spectre x360"),
        (None, "surface pro 9"),
    ],
    "power tools": [
        ("dewalt", "dewalt dcd791"),
        ("milwaukee", "milwaukee m18 fuel"),
        ("makita", "makita xfd131"),
        ("ryobi", "ryobi one+ drill"),
    ],
    "camping": [
        ("coleman", "coleman sundome"),
        ("rei", "rei half dome"),
        ("yeti", "yeti tundra 45"),
        ("kelty", "kelty wireless 4"),
    ],
    "shoes": [
        ("hoka", "hoka clifton 9"),
        ("brooks", "brooks ghost 15"),
        ("nike", "nike pegasus 40"),
        ("asics", "asics gel-kayano 30"),
        ("adidas", "adidas ultraboost"),
    ],
    "vacuum": [
        ("dyson", "dyson v15"),
        ("shark", "shark navigator"),
        (None, "roomba j7"),
        ("bissell", "bissell crosswave"),
        ("shark", "shark stratos"),
    ],
    "coffee": [
        ("breville", "breville barista express"),
        ("nespresso", "nespresso vertuo"),
        ("keurig", "keurig k-elite"),
        ("delonghi", "delonghi dedica"),
    ],
    "kitchen": [
        ("vitamix", "vitamix e310"),
        ("ninja", "ninja foodi"),
        (None, "instant pot duo"),
        ("kitchenaid", "kitchenaid artisan"),
        ("cosori", "cosori pro ii"),
    ],
    "phone": [
        (None, "iphone 15"),
        (None, "pixel 8"),
        (None, "galaxy s24"),
        ("samsung", "samsung galaxy a54"),
        (None, "iphone 14 pro"),
        ("google", "google pixel 7a"),
    ],
    "wearables": [
        (None, "apple watch series 9"),
        ("garmin", "garmin forerunner 265"),
        ("fitbit", "fitbit charge 6"),
        (None, "galaxy watch 6"),
        ("garmin", "garmin venu 3"),
    ],
    "computer": [
        ("logitech", "logitech mx master 3s"),
        ("razer", "razer deathadder v3"),
        ("dell", "dell s2721dgf"),
        ("keychron", "keychron k2"),
        (None, "aeron chair"),
    ],
    "toys": [
        ("lego", "lego millennium falcon"),
        (None, "catan"),
        (None, "ticket to ride"),
        ("dji", "dji mini 3"),
    ],
    "beauty": [
        ("dyson", "dyson airwrap"),
        (None, "shark flexstyle"),
        ("philips", "philips sonicare 4100"),
        ("oral-b", "oral-b io series 9"),
    ],
    "home": [
        ("casper", "casper original mattress"),
        (None, "purple mattress"),
        ("levoit", "levoit core 300"),
        ("dyson", "dyson pure cool"),
    ],
    "outdoor": [
        ("osprey", "osprey atmos 65"),
        ("patagonia", "patagonia nano puff"),
        ("hydro flask", "hydro flask 32 oz"),
        ("north face", "north face thermoball"),
    ],
    "pets": [
        ("kong", "kong classic"),
        ("purina", "purina pro plan"),
        ("blue buffalo", "blue buffalo life protection"),
    ],
    "baby": [
        ("uppababy", "uppababy vista"),
        ("graco", "graco 4ever"),
        ("nanit", "nanit pro"),
        ("chicco", "chicco keyfit 30"),
    ],
    "gaming": [
        (None, "ps5"),
        (None, "xbox series x"),
        (None, "nintendo switch oled"),
        (None, "steam deck"),
        ("steelseries", "steelseries arctis nova 7"),
    ],
    "camera": [
        ("sony", "sony a7 iv"),
        ("canon", "canon r6"),
        ("gopro", "gopro hero 12"),
        ("fujifilm", "fujifilm x-t5"),
        (None, "ring video doorbell 4"),
        (None, "arlo pro 5"),
    ],
    "grill": [
        ("weber", "weber spirit ii"),
        ("traeger", "traeger pro 575"),
        ("ooni", "ooni koda 16"),
        ("blackstone", "blackstone 36 inch griddle"),
    ],
    "appliances": [
        ("lg", "lg wm4000"),
        ("bosch", "bosch 500 series"),
        ("samsung", "samsung bespoke"),
    ],
    "clothes": [
        ("levi's", "levi's 501"),
        (None, "canada goose expedition"),
        ("lululemon", "lululemon align"),
    ],
    "tools": [
        (None, "craftsman v20"),
        ("stanley", "stanley fatmax"),
        ("werner", "werner 6 ft ladder"),
    ],
}

# More brands per category, so the planner learns to copy a brand it has rarely seen rather
# than recall a short list (brand F1 on the eval set, docs/benchmarks.md).
EXTRA_BRANDS: dict[str, list[str]] = {
    "tv": ["toshiba", "insignia", "panasonic"],
    "audio": ["audio-technica", "marshall", "soundcore", "ultimate ears"],
    "laptop": ["razer", "samsung", "gigabyte"],
    "power tools": ["ridgid", "kobalt", "porter-cable", "metabo"],
    "camping": ["nemo", "big agnes", "msr", "therm-a-rest"],
    "shoes": ["puma", "reebok", "altra", "vans"],
    "vacuum": ["miele", "roborock", "tineco", "kenmore"],
    "coffee": ["mr. coffee", "chemex", "gaggia", "oxo"],
    "kitchen": ["oster", "hamilton beach", "breville", "le creuset", "calphalon"],
    "phone": ["motorola", "oneplus", "zagg", "casetify"],
    "wearables": ["whoop", "suunto", "coros", "withings"],
    "computer": ["viewsonic", "hyperx", "steelseries", "acer"],
    "toys": ["melissa & doug", "hot wheels", "nerf", "playmobil"],
    "beauty": ["olay", "dove", "the ordinary", "revlon", "remington"],
    "home": ["tuft & needle", "parachute", "saatva"],
    "outdoor": ["rei", "mountain hardwear", "stanley", "camelbak"],
    "pets": ["royal canin", "iams", "pedigree", "petsafe", "fancy feast"],
    "baby": ["britax", "evenflo", "owlet", "munchkin"],
    "gaming": ["logitech", "razer", "8bitdo", "corsair"],
    "camera": ["panasonic", "blink", "eufy", "insta360"],
    "grill": ["napoleon", "kamado joe", "big green egg", "camp chef"],
    "appliances": ["maytag", "kitchenaid", "electrolux", "haier"],
    "clothes": ["old navy", "wrangler", "the north face", "under armour"],
    "tools": ["husky", "dewalt", "ridgid", "fiskars", "toro"],
}
# Brands of the eval set (data/qp/eval.jsonl) that no generated question may use: they
# measure whether a brand the planner never saw in training is still extracted.
HELD_OUT_BRANDS = frozenset({"brita", "crocs", "samsonite"})
CATEGORIES = [(c, nouns, list(dict.fromkeys(brands + EXTRA_BRANDS.get(c, []))), pre, post)
              for c, nouns, brands, pre, post in CATEGORIES]
ALL_BRANDS = sorted({b for c in CATEGORIES for b in c[2]}, key=lambda b: (-len(b), b))
assert not HELD_OUT_BRANDS & set(ALL_BRANDS)


def named_brand(text: str) -> str | None:
    """The (longest) known brand written in ``text`` as whole words, else None: a model
    name carries a brand filter only when the brand is written ("xbox series x" does,
    "ps5" does not)."""
    padded = f" {text.lower()} "
    return next((b for b in ALL_BRANDS if f" {b} " in padded), None)


FEATURES = [  # (question fragment, kind): kind = "does" | "is" | "kw"
    ("a warranty", "does"),
    ("bluetooth", "does"),
    ("a usb c port", "does"),
    ("a remote", "does"),
    ("a carrying case", "does"),
    ("wifi", "does"),
    ("an auto shut off", "does"),
    ("waterproof", "is"),
    ("dishwasher safe", "is"),
    ("easy to assemble", "is"),
    ("noisy", "is"),
    ("compatible with android", "is"),
    ("good for beginners", "is"),
    ("worth it", "is"),
    ("machine washable", "is"),
    ("true to size", "is"),
    ("heavy", "is"),
    ("refurbished", "is"),
    ("battery life", "kw"),
    ("dimensions", "kw"),
    ("weight", "kw"),
    ("warranty", "kw"),
    ("specs", "kw"),
    ("reviews", "kw"),
    ("colors", "kw"),
    ("size chart", "kw"),
]
QUESTION_FORMS = [  # product_question phrasings beyond does/is
    "how long does the battery last on the {x}",
    "how much does the {x} weigh",
    "what colors does the {x} come in",
    "how big is the {x}",
    "can i use the {x} outside",
    "does the {x} work with alexa",
    "what comes in the box with the {x}",
    "how loud is the {x}",
    "is the {x} easy to clean",
    "can you tell me the dimensions of the {x}",
    "what's the difference between the {x} sizes",
    "does the {x} run small",
    "how do i clean the {x}",
    "is there a newer version of the {x}",
    "what material is the {x} made of",
    "how many watts is the {x}",
    "does the {x} need assembly",
]
PEOPLE = [  # (phrase, search noun)
    ("my dad", "dad"),
    ("my mom", "mom"),
    ("my wife", "wife"),
    ("my husband", "husband"),
    ("my boyfriend", "boyfriend"),
    ("my girlfriend", "girlfriend"),
    ("a coworker", "coworker"),
    ("my grandma", "grandma"),
    ("my grandpa", "grandpa"),
    ("a teenager", "teenager"),
    ("a 10 year old", "10 year old"),
    ("my 6 year old son", "6 year old boy"),
    ("a 3 year old girl", "3 year old girl"),
    ("my 16 year old", "teenager"),
    ("a college student", "college student"),
    ("my boss", "boss"),
    ("my sister", "sister"),
    ("my brother", "brother"),
    ("a new mom", "new mom"),
    ("my teacher", "teacher"),
    ("a friend", "friend"),
    ("my best friend", "best friend"),
    ("a 1 year old", "1 year old"),
    ("my in-laws", "in-laws"),
    ("a nurse", "nurse"),
]
INTERESTS = [
    "cooking",
    "gardening",
    "coffee",
    "hiking",
    "golf",
    "fishing",
    "gaming",
    "reading",
    "yoga",
    "camping",
    "baking",
    "photography",
    "running",
    "music",
    "art",
    "knitting",
    "cycling",
    "travel",
    "skincare",
    "woodworking",
    "board games",
    "tea",
]
OCCASIONS = [
    "birthday",
    "christmas",
    "mother's day",
    "father's day",
    "anniversary",
    "graduation",
    "housewarming",
    "valentine's day",
    "retirement",
    "baby shower",
]
ACTIVITIES = [
    ("a camping trip", "camping"),
    ("a beach vacation", "beach vacation"),
    ("working from home", "home office"),
    ("a new puppy", "puppy"),
    ("starting a garden", "gardening"),
    ("a road trip", "road trip"),
    ("home workouts", "home gym"),
    ("a dorm room", "dorm"),
    ("learning guitar", "guitar"),
    ("a first apartment", "apartment"),
    ("a newborn", "newborn"),
    ("ski season", "ski"),
    ("hosting thanksgiving", "thanksgiving hosting"),
    ("a long flight", "travel"),
    ("marathon training", "running"),
]
ITEMS = [
    "shoes",
    "laptop",
    "phone case",
    "headphones",
    "jacket",
    "vacuum",
    "blender",
    "tv",
    "coffee maker",
    "dress",
    "mattress",
    "backpack",
    "monitor",
    "stroller",
    "drill",
    "air fryer",
    "watch",
    "jeans",
    "tent",
    "keyboard",
    "sheets",
    "dog bed",
    "lamp",
    "rug",
]
OTHER = [
    "what's the weather like tomorrow",
    "tell me a joke",
    "hi",
    "hello there",
    "thanks!",
    "thank you so much",
    "good morning",
    "what is the capital of australia",
    "how many ounces are in a cup",
    "what's 20% of 150",
    "convert 50 dollars to euros",
    "who founded nike",
    "when was apple founded",
    "write a haiku about autumn",
    "translate thank you into french",
    "what time is it in london",
    "who won the world cup",
    "how do i change my password",
    "how do i update my email address",
    "can i talk to a human",
    "recipe for banana bread",
    "how long do i boil an egg",
    "what's the meaning of life",
    "is it going to rain today",
    "how far is the moon",
    "who wrote pride and prejudice",
    "what's your name",
    "are you a robot",
    "help me with my math homework",
    "what's 12 times 8",
    "how do i delete my account",
    "is samsung stock a good buy",
    "what's the population of japan",
    "how tall is the eiffel tower",
    "sing me a song",
    "what year did the titanic sink",
    "explain quantum physics simply",
    "what's a good movie",
    "how do i sign out",
    "what are your store hours",
    "do you have a phone number i can call",
    "how do i add a gift card to my account",
    "my app keeps crashing",
    "what does sku mean",
    "how many calories in a banana",
    "what is 15 plus 27",
    "who is the ceo of amazon",
    "write me a poem about the ocean",
    "how do i learn python",
    "bye",
    "ok",
    "never mind",
    "what's the speed of light",
    "how many days until christmas",
    "what's the best way to study for exams",
    "what does prime membership include",
    "how do i change my shipping address",
    "how do i turn off notifications",
    "what's the square root of 144",
    "who invented the lightbulb",
    "tell me a fun fact",
    "how old is the universe",
    "do dogs dream",
    "what's trending today",
]
MONTHS = [
    "monday",
    "last week",
    "tuesday",
    "two weeks ago",
    "black friday",
    "march 3rd",
    "yesterday",
    "the 12th",
]

K, C = "keyword", "conversational"
PRICE_VALUES = [
    10,
    15,
    20,
    25,
    30,
    35,
    40,
    45,
    50,
    60,
    70,
    75,
    80,
    90,
    100,
    120,
    150,
    200,
    250,
    300,
    350,
    400,
    500,
    600,
    700,
    800,
    1000,
    1200,
    1500,
    2000,
]
PRICE_CAPS = [  # upper-bound phrasings; {p} is the amount as written
    "under {p}",
    "below {p}",
    "less than {p}",
    "for less than {p}",
    "{p} or less",
    "{p} max",
    "max {p}",
    "up to {p}",
    "no more than {p}",
    "budget {p}",
    "within {p}",
    "cheaper than {p}",
    "at most {p}",
    "under {p} please",
    "for under {p}",
    "not over {p}",
    "{p} or under",
    "less than {p} if possible",
    "with a budget of {p}",
    "below {p} ideally",
]
PRICE_SENTENCES = [
    "my budget is {p}",
    "i don't want to spend more than {p}",
    "i can spend up to {p}",
    "i have {p} to spend",
    "keep it under {p}",
    "nothing over {p}",
    "i can't go over {p}",
]


@dataclass
class Example:
    question: str
    plan: dict[str, Any]
    history: list[dict[str, str]] | None = None
    kind: str = ""

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"question": self.question, "intent": self.plan["intent"]}
        if self.history:
            out["history"] = self.history
        out["plan"] = self.plan
        out["kind"] = self.kind
        return out


def price_text(rng: random.Random) -> tuple[str, float | int]:
    """An amount as a customer writes it, and its value."""
    v: float | int = rng.choice(PRICE_VALUES)
    if rng.random() < 0.08 and v >= 20:
        v = round(v - 0.01, 2)
    shown = f"{v:,}" if isinstance(v, int) and v >= 1000 and rng.random() < 0.5 else f"{v}"
    form = rng.random()
    if form < 0.40:
        s = f"${shown}"
    elif form < 0.55:
        s = f"{shown} dollars"
    elif form < 0.65:
        s = f"{shown} bucks"
    elif form < 0.73:
        s = f"£{shown}"
    elif form < 0.78:
        s = f"{shown} pounds"
    elif form < 0.83:
        s = f"€{shown}"
    elif form < 0.86:
        s = f"{shown} euros"
    elif form < 0.88:
        s = f"{shown} usd"
    else:
        s = shown  # bare number after "under"/"max"
    return s, v


def typo(rng: random.Random, text: str, protect: set[str]) -> str:
    """One or two realistic typos in words of 4+ letters that are not protected (brands,
    numbers): swapped, dropped or doubled letters."""
    words = text.split(" ")
    idx = [
        i
        for i, w in enumerate(words)
        if len(w) >= 4
        and w.isalpha()
        and w.lower() not in protect
        and not any(w.lower() in p.split() for p in protect)
    ]
    for i in rng.sample(idx, min(len(idx), rng.choice([1, 1, 2]))):
        w = words[i]
        j = rng.randrange(1, len(w) - 1)
        op = rng.random()
        if op < 0.4:
            w = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
        elif op < 0.7:
            w = w[:j] + w[j + 1 :]
        else:
            w = w[:j] + w[j] + w[j:]
        words[i] = w
    return " ".join(words)


def surface(rng: random.Random, q: str, protect: set[str], sentence: bool) -> str:
    """Case, punctuation and typos: the same plan under many spellings."""
    if rng.random() < 0.12:
        q = typo(rng, q, protect)
    if sentence and rng.random() < 0.45:
        q += rng.choice(["?", "?", ".", "!", " ?", " please", "??"])
    r = rng.random()
    if r < 0.62:
        return q
    if r < 0.88:
        return q[:1].upper() + q[1:]
    if r < 0.96:
        return " ".join(w[:1].upper() + w[1:] for w in q.split(" "))
    return q.upper()


def plan(
    intent: str,
    qtype: str,
    queries: list[str],
    brand: str | None = None,
    max_price: float | int | None = None,
) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    if brand:
        filters["brand"] = brand
    if max_price is not None:
        filters["max_price"] = max_price
    qs = [" ".join(q.split())[:80] for q in queries][:3]
    return {"intent": intent, "query_type": qtype, "search_queries": qs, "filters": filters}


@dataclass
class Product:
    """One sampled product: what the customer may write and the search query it implies."""

    noun: str
    brand: str | None
    pre: str
    post: str
    category: str

    @property
    def query(self) -> str:
        return " ".join(x for x in (self.brand or "", self.pre, self.noun, self.post) if x)


def sample_product(rng: random.Random, brand_p: float = 0.45, attr_p: float = 0.45) -> Product:
    cat, nouns, brands, pres, posts = rng.choice(CATEGORIES)
    return Product(
        rng.choice(nouns),
        rng.choice(brands) if rng.random() < brand_p else None,
        rng.choice(pres) if rng.random() < attr_p else "",
        rng.choice(posts) if rng.random() < attr_p * 0.6 else "",
        cat,
    )


def product_phrase(rng: random.Random, p: Product) -> str:
    """The product as written, the brand in one of several positions."""
    core = " ".join(x for x in (p.pre, p.noun, p.post) if x)
    if not p.brand:
        if p.pre and rng.random() < 0.3:  # "cat food grain free": a word after the noun
            return " ".join(x for x in (p.noun, p.pre, p.post) if x)  # is not a brand
        return core
    r = rng.random()
    if r < 0.55:
        return f"{p.brand} {core}"
    if r < 0.7:
        return f"{core} by {p.brand}"
    if r < 0.82:
        return f"{core} from {p.brand}"
    if r < 0.92:
        return f"{p.pre + ' ' if p.pre else ''}{p.noun} {p.brand}{' ' + p.post if p.post else ''}"
    return f"{core}, {p.brand} brand"


def ex_search(rng: random.Random) -> Example:
    p = sample_product(rng)
    phrase = product_phrase(rng, p)
    price = rng.random() < 0.45
    ps, pv = price_text(rng) if price else ("", None)
    cap = rng.choice(PRICE_CAPS).format(p=ps) if price else ""
    protect = {p.brand or "", ps}
    if rng.random() < 0.5:  # keyword style
        lead = rng.choice(["", "", "", "best ", "cheap ", "good ", "top rated ", "affordable "])
        q = " ".join(x for x in (lead + phrase, cap) if x)
        if rng.random() < 0.1 and cap:
            q = f"{cap} {phrase}"
        query = ("cheap " if lead == "cheap " else "") + p.query
        return Example(
            surface(rng, q, protect, False),
            plan("product_search", K, [query], p.brand, pv),
            kind="search-kw",
        )
    opener = rng.choice(
        [
            "i'm looking for {x}",
            "looking for {x}",
            "show me {x}",
            "can you find me {x}",
            "do you have {x}",
            "i need {x}",
            "help me find {x}",
            "i want to buy {x}",
            "where can i find {x}",
            "what {x} do you have",
            "i'd like to see some {x}",
            "find me {x}",
            "any good {x}",
            "are there any {x} on sale",
            "i am shopping for {x}",
            "searching for {x}",
            "could you show me {x}",
            "i'm in the market for {x}",
        ]
    )
    art = rng.choice(["", "a ", "some "]) if opener.endswith("{x}") and "{x} " not in opener else ""
    q = opener.format(x=art + phrase)
    if price:
        q += rng.choice([" ", ", ", " - "]) + rng.choice(PRICE_CAPS + PRICE_SENTENCES).format(p=ps)
    return Example(
        surface(rng, q, protect, True),
        plan("product_search", C, [p.query], p.brand, pv),
        kind="search-conv",
    )


def _models(rng: random.Random, n: int) -> list[tuple[str | None, str]]:
    cat = rng.choice([c for c, ms in MODELS.items() if len(ms) >= n])
    return rng.sample(MODELS[cat], n)


def ex_compare(rng: random.Random) -> Example:
    n = 3 if rng.random() < 0.25 else 2
    if rng.random() < 0.3:  # brand vs brand for one product type
        _cat, nouns, brands, _, _ = rng.choice(CATEGORIES)
        noun = rng.choice(nouns)
        bs = rng.sample(brands, n)
        names = [f"{b} {noun}" for b in bs]
        shown = [*bs[:-1], f"{bs[-1]} {noun}"] if rng.random() < 0.5 else names
    else:
        names = [m for _, m in _models(rng, n)]
        shown = names
    price = rng.random() < 0.12
    ps, pv = price_text(rng) if price else ("", None)
    protect = {ps, *names}
    if n == 2:
        a, b = shown
        forms = [
            ("{a} vs {b}", K),
            ("{a} vs. {b}", K),
            ("{a} or {b}", K),
            ("{a} versus {b}", K),
            ("{a} compared to {b}", K),
            ("which is better, {a} or {b}", C),
            ("should i buy the {a} or the {b}", C),
            ("what's the difference between {a} and {b}", C),
            ("compare {a} and {b}", C),
            ("is the {a} better than the {b}", C),
            ("{a} or {b}, which one should i get", C),
            ("i can't decide between {a} and {b}", C),
            ("how does the {a} compare to the {b}", C),
            ("is the {a} worth it over the {b}", C),
            ("pros and cons of {a} vs {b}", K),
            ("help me choose between {a} and {b}", C),
        ]
        form, qt = rng.choice(forms)
        q = form.format(a=a, b=b)
    else:
        a, b, c = shown
        forms = [
            ("{a} vs {b} vs {c}", K),
            ("compare {a}, {b} and {c}", C),
            ("which is best: {a}, {b} or {c}", C),
            ("{a}, {b} or {c}", K),
            ("i'm choosing between {a}, {b} and {c}, which is better", C),
        ]
        form, qt = rng.choice(forms)
        q = form.format(a=a, b=b, c=c)
    if price:
        q += rng.choice([" under ", " for under ", ", budget "]) + ps
    return Example(
        surface(rng, q, protect, qt == C),
        plan("product_comparison", qt, names, None, pv),
        kind="compare",
    )


def ex_question(rng: random.Random) -> Example:
    if rng.random() < 0.55:
        _, x = rng.choice(rng.choice(list(MODELS.values())))
        brand, query = named_brand(x), x
    else:
        p = sample_product(rng, brand_p=0.6, attr_p=0.2)
        brand, x, query = p.brand, product_phrase(rng, p), p.query
    feat, kind = rng.choice(FEATURES)
    r = rng.random()
    if kind == "kw" and r < 0.6:
        q, qt = rng.choice([f"{x} {feat}", f"{feat} of {x}", f"{x} {feat}?"]), K
    elif r < 0.35:
        q, qt = rng.choice(QUESTION_FORMS).format(x=x), C
    elif kind == "does":
        q, qt = (
            rng.choice(
                [
                    "does the {x} have {f}",
                    "does the {x} come with {f}",
                    "does {x} have {f}",
                    "do the {x} have {f}",
                ]
            ).format(x=x, f=feat),
            C,
        )
    elif kind == "is":
        q, qt = (
            rng.choice(
                ["is the {x} {f}", "is {x} {f}", "are the {x} {f}", "would the {x} be {f}"]
            ).format(x=x, f=feat),
            C,
        )
    else:
        q, qt = (
            rng.choice(
                [
                    "what is the {f} of the {x}",
                    "what's the {f} on the {x}",
                    "can you tell me the {f} of the {x}",
                ]
            ).format(x=x, f=feat),
            C,
        )
    return Example(
        surface(rng, q, {brand or "", *x.split()}, qt == C),
        plan("product_question", qt, [query], brand),
        kind="question",
    )


def ex_recommend(rng: random.Random) -> Example:
    price = rng.random() < 0.35
    ps, pv = price_text(rng) if price else ("", None)
    cap = (" " + rng.choice(PRICE_CAPS).format(p=ps)) if price else ""
    r = rng.random()
    brand = None
    if r < 0.45:
        who, noun = rng.choice(PEOPLE)
        interest = rng.choice(INTERESTS) if rng.random() < 0.4 else ""
        occ = rng.choice(OCCASIONS) if rng.random() < 0.4 else ""
        query = f"{interest} gifts" if interest else f"gifts for {noun}"
        likes = f" who {rng.choice(['likes', 'loves', 'is into'])} {interest}" if interest else ""
        forms = [
            (f"gift ideas for {who}{likes}{cap}", K),
            (f"{occ or 'birthday'} gift for {who}{likes}{cap}", K),
            (f"what should i get {who}{' for ' + occ if occ else ''}{likes}", C),
            (f"i need a gift for {who}{likes}", C),
            (f"what's a good present for {who}{likes}", C),
            (f"help me pick a gift for {who}{likes}", C),
            (f"any ideas what to buy {who}{likes}", C),
            (f"stocking stuffers for {who}{cap}", K),
            (f"present for {who}{likes}{cap}", K),
            (f"what do you get {who} who has everything", C),
            (f"recommend a {occ or 'birthday'} gift for {who}{likes}", C),
        ]
        q, qt = rng.choice(forms)
        if price and qt == C:
            q += rng.choice([", ", " - ", " "]) + rng.choice(PRICE_CAPS + PRICE_SENTENCES).format(
                p=ps
            )
        if "has everything" in q:
            query = f"gifts for {noun}"
    elif r < 0.7:
        act, key = rng.choice(ACTIVITIES)
        query = f"{key} essentials"
        forms = [
            (f"what do i need for {act}", C),
            (f"essentials for {act}", K),
            (f"recommend some things for {act}", C),
            (f"what should i bring on {act}", C),
            (f"must haves for {act}{cap}", K),
            (f"i'm getting ready for {act}, any suggestions", C),
            (f"suggest gear for {act}", C),
            (f"checklist for {act}", K),
        ]
        q, qt = rng.choice(forms)
        if price and qt == C:
            q += ", " + rng.choice(PRICE_SENTENCES).format(p=ps)
    else:
        p = sample_product(rng, brand_p=0.5, attr_p=0.2)
        use = rng.choice(
            [
                "a beginner",
                "a small apartment",
                "my kids",
                "everyday use",
                "travel",
                "someone with back pain",
                "a small kitchen",
                "a family of 4",
                "a first time buyer",
                "seniors",
            ]
        )
        phrase = product_phrase(rng, p)
        query = f"{p.query} for {use.removeprefix('a ').removeprefix('my ')}"
        brand = p.brand
        forms = [
            (f"recommend a {phrase} for {use}", C),
            (f"which {phrase} would you recommend for {use}", C),
            (f"what {phrase} do you suggest for {use}", C),
            (f"suggest a good {phrase} for {use}", C),
            (f"can you recommend a {phrase}", C),
            (f"what's a good {phrase} for {use}", C),
            (f"i need advice on a {phrase} for {use}", C),
        ]
        q, qt = rng.choice(forms)
        if "recommend a " in q and " for " not in q:
            query = p.query
        if price:
            q += rng.choice([", ", " "]) + rng.choice(PRICE_CAPS + PRICE_SENTENCES).format(p=ps)
    return Example(
        surface(rng, q, {ps, brand or ""}, qt == C),
        plan("recommendation", qt, [query], brand, pv),
        kind="recommend",
    )


def ex_order(rng: random.Random) -> Example:
    item = rng.choice(ITEMS) if rng.random() < 0.55 else ""
    num = f"{rng.randint(100, 999)}-{rng.randint(1000000, 9999999)}"
    if item:
        forms = [
            (f"where is my {item}", C),
            (f"where's my {item} order", C),
            (f"track my {item} order", C),
            (f"has my {item} shipped yet", C),
            (f"when will my {item} arrive", C),
            (f"my {item} hasn't arrived", C),
            (f"{item} order status", K),
            (f"is my {item} out for delivery", C),
            (f"my {item} was supposed to come {rng.choice(MONTHS)}", C),
            (f"i ordered a {item} {rng.choice(MONTHS)} and it still isn't here", C),
            (f"tracking number for my {item}", K),
            (f"why is my {item} order delayed", C),
            (f"delivery date for my {item}", K),
            (f"the {item} i ordered says delivered but it's not here", C),
        ]
        query = f"{item} order"
    else:
        forms = [
            ("where is my order", C),
            ("where's my package", C),
            ("track my order", C),
            ("order status", K),
            ("track package", K),
            (f"track order {num}", K),
            (f"status of order #{num}", K),
            ("when will my order arrive", C),
            ("my package hasn't arrived yet", C),
            ("has my order shipped", C),
            ("my order is late", C),
            (f"i placed an order {rng.choice(MONTHS)}, when will it come", C),
            ("can you check on my delivery", C),
            ("package says delivered but i didn't get it", C),
            ("how long does shipping take for my order", C),
            ("is my order on the way", C),
            ("where is my stuff", C),
            ("order still not here", K),
            ("my tracking hasn't updated in days", C),
        ]
        query = "order status"
    q, qt = rng.choice(forms)
    return Example(surface(rng, q, {num}, qt == C), plan("order_status", qt, [query]), kind="order")


def ex_returns(rng: random.Random) -> Example:
    item = rng.choice(ITEMS) if rng.random() < 0.6 else ""
    if item:
        kind = rng.choice(["return", "return", "refund", "exchange"])
        forms = {
            "return": [
                (f"how do i return my {item}", C),
                (f"return {item}", K),
                (f"i want to send back the {item}", C),
                (f"can i return an opened {item}", C),
                (f"the {item} doesn't fit, how do i return it", C),
                (f"{item} return", K),
                (f"is the {item} returnable", C),
                (f"return label for my {item}", K),
                (f"i'd like to return the {item} i bought {rng.choice(MONTHS)}", C),
            ],
            "refund": [
                (f"refund for my {item}", K),
                (f"my {item} arrived broken, i want a refund", C),
                (f"how do i get my money back for the {item}", C),
                (f"when will i get my refund for the {item}", C),
                (f"the {item} is defective, can i get a refund", C),
            ],
            "exchange": [
                (f"exchange my {item} for a different size", C),
                (f"exchange {item}", K),
                (f"can i swap my {item} for another color", C),
                (f"i got the wrong {item}, can i exchange it", C),
            ],
        }[kind]
        q, qt = rng.choice(forms)
        query = f"{item} {kind}"
    else:
        forms = [
            ("return policy", K, "return policy"),
            ("what is your return policy", C, "return policy"),
            ("how do i start a return", C, "return policy"),
            ("how long do refunds take", C, "refund status"),
            ("where is my refund", C, "refund status"),
            ("refund status", K, "refund status"),
            ("i haven't received my refund yet", C, "refund status"),
            ("can i return something without a receipt", C, "return policy"),
            ("how many days do i have to return an item", C, "return policy"),
            ("do you offer free returns", C, "return policy"),
            ("print return label", K, "return policy"),
            ("cancel my return", K, "return policy"),
            ("i want my money back", C, "refund status"),
            ("can i return a gift", C, "return policy"),
        ]
        q, qt, query = rng.choice(forms)
    return Example(
        surface(rng, q, set(), qt == C), plan("returns_refunds", qt, [query]), kind="returns"
    )


BRAND_TRIVIA = [  # off-topic questions about a brand, not a search: no brand filter
    "is {b} a japanese company",
    "who owns {b}",
    "where is {b} based",
    "how do you pronounce {b}",
    "when was {b} founded",
    "is {b} stock a good buy",
    "who is the ceo of {b}",
    "what country is {b} from",
]


def ex_other(rng: random.Random) -> Example:
    q = rng.choice(OTHER)
    if rng.random() < 0.3:
        q = rng.choice(BRAND_TRIVIA).format(b=rng.choice(ALL_BRANDS))
    shown = surface(rng, q, set(q.split()), True)
    norm = " ".join(shown.split())
    return Example(shown, plan("other", C, [norm]), kind="other")


def _brand_case(rng: random.Random, b: str) -> str:
    r = rng.random()
    return b.upper() if r < 0.2 else b.title() if r < 0.9 else b


def _reply(rng: random.Random, what: str, p: Product | None = None) -> str:
    """The assistant's previous answer. Half name products (brands, models, a price) the way
    the assistant's answers do: a brand the assistant named is not the customer's filter."""
    if p is not None and rng.random() < 0.5:
        cat = next(c for c in CATEGORIES if c[0] == p.category)
        bs = [_brand_case(rng, b) for b in rng.sample(cat[2], min(3, len(cat[2])))]
        if p.brand:
            bs[0] = _brand_case(rng, p.brand)
        models = MODELS.get(p.category) or [(None, what)]
        _, m = rng.choice(models)
        ps, _ = price_text(rng)
        return rng.choice([
            f"Here are some {what} from {bs[0]}, {bs[1]} and {bs[-1]}.",
            f"The {m.title()} is a best seller.",
            f"These {what} are popular: the {m.title()} is {ps}.",
            f"I found {what} from {bs[0]} and {bs[1]}, starting at {ps}.",
            f"Top picks: {bs[0]} and {bs[-1]}. The {m} has great reviews.",
        ])
    return rng.choice(
        [
            f"Here are some {what} you might like.",
            f"I found several {what}.",
            f"Sure! These {what} are popular right now.",
            f"Here are the top rated {what}.",
            f"These {what} have great reviews.",
        ]
    )


def ex_multiturn(rng: random.Random) -> Example:
    """A follow-up whose product (and earlier filters) come from the history."""
    p = sample_product(rng, brand_p=0.5, attr_p=0.3)
    first = product_phrase(rng, p)
    hprice = rng.random() < 0.2
    hps, hpv = price_text(rng) if hprice else ("", None)
    u1 = rng.choice(
        ["i'm looking for {x}", "show me {x}", "{x}", "i need {x}", "do you have {x}"]
    ).format(x=first)
    if hprice:
        u1 += " " + rng.choice(PRICE_CAPS).format(p=hps)
    history = [
        {"role": "user", "content": u1},
        {"role": "assistant", "content": _reply(rng, p.noun, p)},
    ]
    if rng.random() < 0.2:  # an earlier, unrelated exchange before
        history = [
            {"role": "user", "content": rng.choice(["hi", "hello", "hey there"])},
            {"role": "assistant", "content": "Hi! How can I help you today?"},
            *history,
        ]
    r = rng.random()
    if r < 0.3:
        ps, pv = price_text(rng)
        q = rng.choice(
            [
                "any under {p}?",
                "what about under {p}",
                "anything cheaper than {p}?",
                "show me ones under {p}",
                "i only want to spend {p}",
                "do you have any for less than {p}",
                "{p} max please",
                "can you find one below {p}",
            ]
        ).format(p=ps)
        pl = plan("product_search", C, [p.query], p.brand, pv)
    elif r < 0.45:
        cat = next(c for c in CATEGORIES if c[0] == p.category)
        b2 = rng.choice([b for b in cat[2] if b != p.brand])
        q = rng.choice(
            [
                "what about {b}?",
                "do you have any from {b}",
                "show me {b} ones instead",
                "any by {b}?",
                "i prefer {b}",
            ]
        ).format(b=b2)
        p2 = Product(p.noun, b2, p.pre, p.post, p.category)
        pl = plan("product_search", C, [p2.query], b2, hpv)
        p = p2  # the follow-up's brand is protected from typos below
    elif r < 0.6:
        feat, kind = rng.choice([f for f in FEATURES if f[1] != "kw"])
        q = rng.choice(
            [
                f"is it {feat}" if kind == "is" else f"does it have {feat}",
                f"are they {feat}" if kind == "is" else f"do they come with {feat}",
                "which one has the best battery life",
                "how long is the warranty on the first one",
                "what sizes does the second one come in",
                "which of these is the lightest",
            ]
        )
        pl = plan("product_question", C, [p.query], p.brand)
    elif r < 0.7:
        _, m = rng.choice(MODELS.get(p.category) or [(None, "the cheaper model")])
        q = rng.choice(
            [
                "how does it compare to the {m}",
                "is it better than the {m}",
                "compare the first one with the {m}",
                "vs the {m}?",
            ]
        ).format(m=m)
        pl = plan("product_comparison", C if not q.startswith("vs") else K, [p.query, m])
    elif r < 0.78:
        q = rng.choice(
            [
                "ok i ordered one, when will it arrive?",
                "i bought it last week, where is it",
                "great, can you track my order",
                "i already ordered it, has it shipped?",
            ]
        )
        pl = plan("order_status", C, [f"{p.noun} order"])
    elif r < 0.86:
        q = rng.choice(
            [
                "can i return it if it doesn't fit",
                "what if i don't like it, can i send it back",
                "is it returnable",
                "how do i return the one i bought",
            ]
        )
        pl = plan("returns_refunds", C, [f"{p.noun} return"])
    elif r < 0.93:
        q = rng.choice(
            [
                "thanks!",
                "thank you, that's all",
                "ok cool",
                "what's the weather today",
                "never mind",
                "bye",
            ]
        )
        pl = plan("other", C, [" ".join(q.split())])
    else:
        who, _noun = rng.choice(PEOPLE)
        q = rng.choice(
            [
                f"would any of these make a good gift for {who}",
                f"which one would you recommend for {who}",
            ]
        )
        pl = plan("recommendation", C, [f"{p.query} gift"], p.brand, hpv)
    if pl["intent"] == "product_search" and hpv is not None and "max_price" not in pl["filters"]:
        pl["filters"]["max_price"] = hpv
    return Example(surface(rng, q, {p.brand or ""}, True), pl, history, kind="multiturn")


GENERATORS = [
    (ex_search, 0.26),
    (ex_compare, 0.11),
    (ex_question, 0.13),
    (ex_recommend, 0.12),
    (ex_order, 0.08),
    (ex_returns, 0.08),
    (ex_other, 0.07),
    (ex_multiturn, 0.15),
]


def build(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict[str, Any]]:  # type: ignore[assignment]
    """``n`` distinct questions (by question + history), deterministic for a seed."""
    rng = random.Random(seed)
    fns, weights = zip(*GENERATORS, strict=True)
    out: list[dict[str, Any]] = []
    seen = {q.lower() for q in exclude}
    tries = 0
    while len(out) < n and tries < n * 20:
        tries += 1
        ex = rng.choices(fns, weights)[0](rng)
        key = ex.question.lower() + "|" + str(ex.history)
        if key in seen or ex.question.lower() in seen:
            continue
        seen.add(key)
        out.append(ex.row())
    return out


DATA = Path(__file__).resolve().parents[2] / "data" / "qp"
TRAIN_SIZE, TRAIN_SEED = 4000, 1
CALIB_SIZE, CALIB_SEED = 300, 2


def render_sets(train_n: int = TRAIN_SIZE, calib_n: int = CALIB_SIZE) -> dict[str, str]:
    """JSONL text of the training and calibration sets (calibration disjoint from training)."""
    import json

    train = build(train_n, TRAIN_SEED)
    calib = build(calib_n, CALIB_SEED, exclude={r["question"] for r in train})
    return {
        name: "".join(json.dumps(r) + "\n" for r in rows)
        for name, rows in (("train", train), ("calib", calib))
    }


def main(argv: list[str] | None = None, doc: str = __doc__) -> int:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=TRAIN_SIZE)
    ap.add_argument("--calib", type=int, default=CALIB_SIZE)
    ap.add_argument("--out", default=str(DATA))
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if the committed files differ from the generator's output")
    a = ap.parse_args(argv)
    out = Path(a.out)
    for name, text in render_sets(a.train, a.calib).items():
        path = out / f"{name}.jsonl"
        if a.check:
            same = path.exists() and path.read_text(encoding="utf-8") == text
            print(f"{path}: {'up to date' if same else 'DIFFERS'}")
            if not same:
                return 1
            continue
        path.write_text(text, encoding="utf-8")
        print(f"wrote {text.count(chr(10))} questions to {path}")
    return 0

