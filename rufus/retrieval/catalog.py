"""Product catalog: a seeded synthetic generator and a validated loader for a user's own file.

The generator is the default catalog (no real product data ships with the project): every
product comes from per-category tables of real-world brands, product lines, nouns and
attributes, so shopping queries ("running shoes under $80", "nike running shoes",
"wireless earbuds under $50", "65 inch tv") retrieve sensible results. Same seed, same
catalog, byte for byte (the relevance set in data/retrieval/ refers to its ids).

Your own catalog: JSON Lines or CSV with the fields of :class:`Product` (``attributes`` is a
JSON object, in CSV a JSON string); :func:`load_catalog` validates every row and raises
:class:`CatalogError` naming the row and the field.

    python scripts/build_catalog.py                      # generated catalog + index
    python scripts/build_catalog.py --catalog my.jsonl   # your own
"""
# The category tables below are data, one category per block: long lines read better there.
# ruff: noqa: E501

from __future__ import annotations

import csv
import json
import math
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BASE_URL = "https://shop.example.com"
IMAGE_URL = "https://images.shop.example.com"
DEFAULT_SEED = 16
DEFAULT_SIZE = 24_000


@dataclass(frozen=True)
class Product:
    id: str
    title: str
    brand: str
    category: str
    price: float
    rating: float
    review_count: int
    description: str
    url: str
    image_url: str
    attributes: dict[str, str] = field(default_factory=dict)

    def card(self) -> dict[str, Any]:
        """What a client sees: the product card (assistant ``products`` event)."""
        return {"id": self.id, "title": self.title, "brand": self.brand, "price": self.price,
                "rating": self.rating, "url": self.url, "image_url": self.image_url}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------ category tables
# Each category: display name, nouns used in titles, brands -> product lines, price range
# (log-uniform), attribute choices, and phrases for descriptions.

@dataclass(frozen=True)
class Category:
    key: str
    nouns: tuple[str, ...]
    brands: dict[str, tuple[str, ...]]
    price: tuple[float, float]
    attrs: dict[str, tuple[str, ...]]
    uses: tuple[str, ...]


C = Category
CATEGORIES: tuple[Category, ...] = (
    C("running_shoes", ("Running Shoes", "Road Running Shoes", "Trail Running Shoes", "Running Sneakers"),
      {"Nike": ("Pegasus 41", "Vomero 18", "Invincible 3", "Structure 25", "Revolution 7"),
       "Adidas": ("Ultraboost 5", "Adizero SL", "Supernova Rise", "Duramo Speed"),
       "Brooks": ("Ghost 16", "Glycerin 21", "Adrenaline GTS 24", "Launch 10"),
       "ASICS": ("Gel-Nimbus 26", "Gel-Kayano 31", "Novablast 4", "Gel-Contend 9"),
       "Hoka": ("Clifton 9", "Bondi 8", "Mach 6", "Speedgoat 6"),
       "New Balance": ("Fresh Foam 1080v14", "FuelCell Rebel v4", "880v14", "Arishi v4"),
       "Saucony": ("Ride 17", "Endorphin Speed 4", "Kinvara 15", "Guide 17"),
       "Puma": ("Velocity Nitro 3", "Deviate Nitro 3", "Softride Pro")},
      (45, 180), {"gender": ("Men's", "Women's"), "color": ("Black", "White", "Blue", "Grey", "Red"),
                  "size": ("7", "8", "9", "10", "11", "12")},
      ("daily training", "long runs", "race day", "trail running", "marathon training")),
    C("sneakers", ("Sneakers", "Casual Shoes", "Lifestyle Sneakers", "Walking Shoes"),
      {"Nike": ("Air Force 1", "Air Max 90", "Court Vision", "Dunk Low"),
       "Adidas": ("Samba OG", "Stan Smith", "Gazelle", "Grand Court 2.0"),
       "Vans": ("Old Skool", "Authentic", "Sk8-Hi"), "Converse": ("Chuck Taylor All Star", "Run Star"),
       "Skechers": ("Go Walk 7", "Arch Fit", "D'Lites"), "New Balance": ("574", "530", "9060")},
      (40, 150), {"gender": ("Men's", "Women's", "Kids'"), "color": ("Black", "White", "Navy", "Beige")},
      ("everyday wear", "walking", "casual outfits")),
    C("headphones", ("Over-Ear Headphones", "Noise Cancelling Headphones", "Wireless Headphones"),
      {"Sony": ("WH-1000XM5", "WH-CH720N", "ULT Wear"), "Bose": ("QuietComfort Ultra", "QuietComfort 45"),
       "Apple": ("AirPods Max",), "Sennheiser": ("Momentum 4", "HD 450BT", "Accentum"),
       "JBL": ("Tune 770NC", "Live 770NC", "Tour One M2"), "Beats": ("Studio Pro", "Solo 4"),
       "Anker": ("Soundcore Space One", "Soundcore Life Q30")},
      (40, 550), {"color": ("Black", "Silver", "Midnight Blue", "White"),
                  "battery": ("30 hours", "40 hours", "60 hours")},
      ("travel", "the office", "commuting", "focus")),
    C("earbuds", ("Wireless Earbuds", "True Wireless Earbuds", "Bluetooth Earbuds", "Noise Cancelling Earbuds"),
      {"Apple": ("AirPods 4", "AirPods Pro 2"), "Samsung": ("Galaxy Buds3", "Galaxy Buds FE"),
       "Sony": ("WF-1000XM5", "WF-C700N", "LinkBuds S"), "JBL": ("Tune Buds", "Vibe Beam", "Live Pro 2"),
       "Anker": ("Soundcore Liberty 4", "Soundcore P40i", "Soundcore A20i"),
       "Jabra": ("Elite 8 Active", "Elite 4"), "Skullcandy": ("Dime 3", "Indy Evo"),
       "Beats": ("Studio Buds+", "Fit Pro", "Solo Buds")},
      (18, 300), {"color": ("Black", "White", "Navy", "Sage"), "water_resistance": ("IPX4", "IPX5", "IP57")},
      ("workouts", "calls", "commuting", "running")),
    C("tv", ("Smart TV", "4K UHD Smart TV", "QLED TV", "OLED TV", "LED TV"),
      {"Samsung": ("Crystal UHD DU7200", "QLED Q60D", "Neo QLED QN90D", "OLED S90D"),
       "LG": ("UHD UT7000", "QNED80", "OLED C4", "OLED B4"), "Sony": ("Bravia 3", "Bravia 7", "Bravia 8"),
       "TCL": ("S4 Series", "Q6 Series", "QM8 Series"), "Hisense": ("A6 Series", "U6 Series", "U8 Series"),
       "Vizio": ("V-Series", "M-Series Quantum"), "Insignia": ("F30 Series", "F50 QLED")},
      (150, 3000), {"screen_size": ("32", "43", "50", "55", "65", "75", "85"),
                    "resolution": ("4K UHD", "1080p", "4K HDR")},
      ("movie nights", "gaming", "sports", "the living room")),
    C("laptop", ("Laptop", "Notebook", "Thin and Light Laptop", "Gaming Laptop", "2-in-1 Laptop"),
      {"Apple": ("MacBook Air 13 M3", "MacBook Air 15 M3", "MacBook Pro 14 M4"),
       "Dell": ("Inspiron 15", "XPS 13", "Latitude 5450"), "HP": ("Pavilion 15", "Envy x360", "Victus 15"),
       "Lenovo": ("IdeaPad Slim 3", "ThinkPad E14", "Legion 5", "Yoga 7"),
       "ASUS": ("Vivobook 15", "Zenbook 14 OLED", "ROG Strix G16", "TUF Gaming A15"),
       "Acer": ("Aspire 5", "Swift Go 14", "Nitro V 15"), "Microsoft": ("Surface Laptop 7",)},
      (280, 2800), {"ram": ("8GB RAM", "16GB RAM", "32GB RAM"), "storage": ("256GB SSD", "512GB SSD", "1TB SSD"),
                    "screen_size": ("13.3", "14", "15.6", "16")},
      ("college", "work from home", "gaming", "programming", "travel")),
    C("smartphone", ("Smartphone", "Unlocked Smartphone", "5G Phone", "Cell Phone"),
      {"Apple": ("iPhone 16", "iPhone 16 Pro", "iPhone 15"), "Samsung": ("Galaxy S24", "Galaxy A35", "Galaxy Z Flip6"),
       "Google": ("Pixel 9", "Pixel 9 Pro", "Pixel 8a"), "Motorola": ("Moto G Power", "Edge 2024", "Razr"),
       "OnePlus": ("OnePlus 12", "Nord N30")},
      (150, 1400), {"storage": ("128GB", "256GB", "512GB"), "color": ("Black", "Blue", "Green", "Titanium")},
      ("photography", "everyday use", "battery life")),
    C("smartwatch", ("Smartwatch", "Fitness Tracker", "GPS Running Watch", "Fitness Watch"),
      {"Apple": ("Watch Series 10", "Watch SE", "Watch Ultra 2"), "Samsung": ("Galaxy Watch7", "Galaxy Fit3"),
       "Garmin": ("Forerunner 265", "Forerunner 165", "Venu 3", "Fenix 8", "Instinct 2"),
       "Fitbit": ("Charge 6", "Versa 4", "Inspire 3"), "Amazfit": ("Bip 5", "GTR 4", "Balance"),
       "Coros": ("Pace 3", "Apex 2")},
      (30, 900), {"case_size": ("40mm", "42mm", "44mm", "46mm"), "color": ("Black", "Silver", "Pink", "Slate")},
      ("running", "sleep tracking", "fitness", "heart rate monitoring")),
    C("tablet", ("Tablet", "Android Tablet", "Kids Tablet", "E-Reader"),
      {"Apple": ("iPad 10th Generation", "iPad Air 11", "iPad mini", "iPad Pro 13"),
       "Samsung": ("Galaxy Tab S9 FE", "Galaxy Tab A9+", "Galaxy Tab S10"),
       "Amazon": ("Fire HD 10", "Fire HD 8", "Kindle Paperwhite", "Fire HD 10 Kids"),
       "Lenovo": ("Tab M11", "Tab P12"), "Microsoft": ("Surface Pro 11",)},
      (60, 1300), {"storage": ("32GB", "64GB", "128GB", "256GB"), "screen_size": ("8", "10.9", "11", "13")},
      ("reading", "streaming", "kids", "note taking")),
    C("camera", ("Mirrorless Camera", "Digital Camera", "Action Camera", "Instant Camera"),
      {"Canon": ("EOS R50", "EOS R8", "EOS R6 Mark II", "PowerShot G7 X"),
       "Sony": ("Alpha a6400", "Alpha 7 IV", "ZV-E10", "ZV-1F"), "Nikon": ("Z50 II", "Z6 III", "Zf"),
       "Fujifilm": ("X-T5", "X100VI", "Instax Mini 12"), "GoPro": ("HERO13 Black", "HERO12 Black"),
       "DJI": ("Osmo Action 5 Pro", "Osmo Pocket 3")},
      (60, 2600), {"kit": ("Body Only", "with 18-45mm Lens", "with 24-105mm Lens"),
                   "resolution": ("24MP", "33MP", "40MP")},
      ("vlogging", "travel photos", "sports", "beginners")),
    C("coffee_maker", ("Coffee Maker", "Espresso Machine", "Single Serve Coffee Maker", "Drip Coffee Maker"),
      {"Keurig": ("K-Classic", "K-Elite", "K-Mini"), "Nespresso": ("Vertuo Next", "Essenza Mini", "Lattissima One"),
       "Breville": ("Barista Express", "Bambino Plus", "Precision Brewer"),
       "Cuisinart": ("DCC-3200", "Grind & Brew", "SS-10"), "Ninja": ("Specialty Coffee Maker", "Luxe Cafe"),
       "De'Longhi": ("Dedica", "Magnifica Evo"), "Mr. Coffee": ("12-Cup Programmable", "Frappe")},
      (25, 900), {"capacity": ("1 cup", "5 cups", "12 cups", "14 cups"), "color": ("Black", "Stainless Steel", "Red")},
      ("busy mornings", "lattes", "the office", "small kitchens")),
    C("blender", ("Blender", "Countertop Blender", "Personal Blender", "Immersion Blender"),
      {"Vitamix": ("E310 Explorian", "5200", "A3500"), "Ninja": ("Professional BL610", "Nutri-Blender Pro", "Foodi Power"),
       "NutriBullet": ("Pro 900", "Blender Combo"), "KitchenAid": ("K400", "Cordless Hand Blender"),
       "Hamilton Beach": ("Power Elite", "Wave Crusher"), "Oster": ("Pro 1200", "My Blend")},
      (20, 600), {"capacity": ("24 oz", "48 oz", "64 oz", "72 oz"), "power": ("700W", "1000W", "1500W")},
      ("smoothies", "frozen drinks", "soups", "meal prep")),
    C("vacuum", ("Vacuum Cleaner", "Cordless Stick Vacuum", "Robot Vacuum", "Upright Vacuum"),
      {"Dyson": ("V8", "V15 Detect", "Ball Animal 3"), "Shark": ("Navigator Lift-Away", "Stratos", "AI Robot"),
       "iRobot": ("Roomba 694", "Roomba j7+", "Roomba Combo i5"), "Bissell": ("CleanView", "Pet Hair Eraser", "CrossWave"),
       "Hoover": ("WindTunnel", "ONEPWR Evolve"), "Eufy": ("RoboVac 11S", "RoboVac X10"),
       "Roborock": ("Q5", "S8")},
      (70, 1000), {"type": ("Bagless", "Cordless", "Corded"), "pet": ("Pet", "Standard")},
      ("pet hair", "hardwood floors", "carpets", "small apartments")),
    C("air_fryer", ("Air Fryer", "Air Fryer Oven", "Dual Basket Air Fryer"),
      {"Ninja": ("AF101", "Foodi DualZone", "Crispi"), "Cosori": ("Pro LE", "TurboBlaze", "Dual Blaze"),
       "Instant": ("Vortex Plus", "Vortex Slim"), "Philips": ("Airfryer XXL", "Essential Airfryer"),
       "Chefman": ("TurboFry", "Multifunctional"), "Gourmia": ("Digital Air Fryer",)},
      (40, 300), {"capacity": ("2 qt", "4 qt", "5.8 qt", "8 qt", "10 qt"), "color": ("Black", "Grey", "White")},
      ("crispy fries", "quick dinners", "families", "healthy cooking")),
    C("backpack", ("Backpack", "Laptop Backpack", "Hiking Backpack", "Travel Backpack", "School Backpack"),
      {"JanSport": ("SuperBreak", "Right Pack", "Big Student"), "Osprey": ("Daylite Plus", "Talon 22", "Farpoint 40"),
       "The North Face": ("Borealis", "Recon", "Jester"), "Herschel": ("Little America", "Heritage"),
       "Samsonite": ("Tectonic", "Classic Business"), "Matein": ("Travel Laptop Backpack",)},
      (25, 220), {"capacity": ("20L", "28L", "30L", "40L"), "color": ("Black", "Navy", "Green", "Grey")},
      ("school", "commuting", "hiking", "travel")),
    C("yoga_mat", ("Yoga Mat", "Exercise Mat", "Non-Slip Yoga Mat"),
      {"Manduka": ("PRO", "PROlite", "GRP Adapt"), "Gaiam": ("Premium Print", "Essentials"),
       "Lululemon": ("The Mat 5mm", "The Mat 3mm"), "Liforme": ("Original",), "BalanceFrom": ("GoYoga",),
       "Alo Yoga": ("Warrior Mat",)},
      (15, 150), {"thickness": ("3mm", "4mm", "5mm", "6mm", "10mm"), "color": ("Purple", "Black", "Blue", "Teal")},
      ("hot yoga", "pilates", "home workouts", "stretching")),
    C("dumbbells", ("Adjustable Dumbbells", "Dumbbell Set", "Hex Dumbbells", "Kettlebell"),
      {"Bowflex": ("SelectTech 552", "SelectTech 1090"), "PowerBlock": ("Elite EXP", "Pro 50"),
       "CAP Barbell": ("Rubber Hex", "Neoprene Set"), "Amazon Basics": ("Neoprene Dumbbell", "Cast Iron Kettlebell"),
       "Rogue": ("Rubber Hex Dumbbell",), "Yes4All": ("Vinyl Kettlebell", "Adjustable Set")},
      (15, 500), {"weight": ("5 lb", "10 lb", "25 lb", "52.5 lb", "90 lb")},
      ("home gym", "strength training", "beginners")),
    C("water_bottle", ("Water Bottle", "Insulated Water Bottle", "Tumbler"),
      {"Hydro Flask": ("Wide Mouth", "Standard Mouth", "All Around Tumbler"), "Stanley": ("Quencher H2.0", "IceFlow"),
       "Yeti": ("Rambler", "Rambler Tumbler"), "Owala": ("FreeSip", "FreeSip Sway"),
       "CamelBak": ("Chute Mag", "Eddy+"), "Nalgene": ("Wide Mouth Sustain",)},
      (10, 60), {"capacity": ("20 oz", "24 oz", "32 oz", "40 oz"), "color": ("Black", "Pink", "Blue", "White", "Green")},
      ("the gym", "hiking", "school", "the office")),
    C("jacket", ("Jacket", "Rain Jacket", "Puffer Jacket", "Fleece Jacket", "Winter Coat"),
      {"The North Face": ("Antora", "ThermoBall Eco", "Denali"), "Patagonia": ("Nano Puff", "Torrentshell 3L", "Better Sweater"),
       "Columbia": ("Watertight II", "Powder Lite", "Steens Mountain"), "Carhartt": ("Detroit", "Rain Defender"),
       "Arc'teryx": ("Atom Hoody", "Beta"), "Amazon Essentials": ("Lightweight Puffer",)},
      (35, 450), {"gender": ("Men's", "Women's"), "color": ("Black", "Navy", "Olive", "Red"), "size": ("S", "M", "L", "XL")},
      ("rainy days", "hiking", "winter", "layering")),
    C("tshirt", ("T-Shirt", "Crew Neck T-Shirt", "Performance T-Shirt", "Graphic Tee"),
      {"Hanes": ("ComfortSoft", "Beefy-T"), "Gildan": ("Heavy Cotton", "Softstyle"), "Nike": ("Dri-FIT Legend", "Sportswear Club"),
       "Under Armour": ("Tech 2.0", "Sportstyle"), "Champion": ("Classic Jersey",), "Carhartt": ("Workwear Pocket",)},
      (8, 45), {"gender": ("Men's", "Women's"), "color": ("Black", "White", "Heather Grey", "Navy"), "size": ("S", "M", "L", "XL")},
      ("the gym", "everyday wear", "layering")),
    C("jeans", ("Jeans", "Slim Fit Jeans", "Straight Leg Jeans", "Relaxed Fit Jeans"),
      {"Levi's": ("501 Original", "511 Slim", "505 Regular", "Wedgie Straight"), "Wrangler": ("Cowboy Cut", "Authentics"),
       "Lee": ("Extreme Motion", "Ultra Lux"), "Gap": ("Vintage Slim", "Cheeky Straight"),
       "Amazon Essentials": ("Athletic Fit",)},
      (25, 120), {"gender": ("Men's", "Women's"), "color": ("Dark Wash", "Light Wash", "Black"), "size": ("30", "32", "34", "36")},
      ("everyday wear", "work", "casual outfits")),
    C("sunglasses", ("Sunglasses", "Polarized Sunglasses", "Aviator Sunglasses"),
      {"Ray-Ban": ("Wayfarer", "Aviator Classic", "Clubmaster"), "Oakley": ("Holbrook", "Frogskins", "Sutro"),
       "Costa": ("Fantail", "Tuna Alley"), "Maui Jim": ("Peahi", "Red Sands"), "Knockaround": ("Premiums",),
       "Goodr": ("OG Running Sunglasses",)},
      (15, 300), {"lens": ("Polarized", "Non-Polarized"), "color": ("Black", "Tortoise", "Gold")},
      ("driving", "fishing", "running", "the beach")),
    C("bluetooth_speaker", ("Bluetooth Speaker", "Portable Speaker", "Waterproof Speaker", "Smart Speaker"),
      {"JBL": ("Flip 6", "Charge 5", "Clip 5", "Go 4"), "Bose": ("SoundLink Flex", "SoundLink Max"),
       "Sony": ("ULT Field 1", "SRS-XB100"), "Ultimate Ears": ("BOOM 4", "WONDERBOOM 4"),
       "Anker": ("Soundcore 2", "Soundcore Motion 300"), "Amazon": ("Echo Dot", "Echo Pop"),
       "Sonos": ("Roam 2", "Era 100")},
      (20, 450), {"color": ("Black", "Blue", "Red", "Teal"), "water_resistance": ("IPX7", "IP67", "none")},
      ("the beach", "parties", "the shower", "camping")),
    C("monitor", ("Monitor", "Gaming Monitor", "4K Monitor", "Curved Monitor"),
      {"Dell": ("S2722QC", "UltraSharp U2723QE", "SE2425H"), "LG": ("UltraGear 27GP850", "27UP850", "UltraWide 34WP65C"),
       "Samsung": ("Odyssey G5", "ViewFinity S7", "Smart Monitor M8"), "ASUS": ("TUF Gaming VG27AQ", "ProArt PA278QV"),
       "Acer": ("Nitro XV272U", "SB242Y"), "BenQ": ("GW2480", "MOBIUZ EX2710Q")},
      (90, 1200), {"screen_size": ("24", "27", "32", "34"), "refresh_rate": ("60Hz", "144Hz", "165Hz", "240Hz")},
      ("gaming", "photo editing", "the home office")),
    C("keyboard", ("Keyboard", "Mechanical Keyboard", "Wireless Keyboard", "Gaming Keyboard"),
      {"Logitech": ("MX Keys S", "K380", "G915 TKL", "Pop Keys"), "Keychron": ("K2", "Q1 Pro", "V1"),
       "Razer": ("BlackWidow V4", "Huntsman Mini"), "Corsair": ("K70 RGB Pro", "K55"),
       "Apple": ("Magic Keyboard",), "Microsoft": ("Ergonomic Keyboard",)},
      (20, 250), {"layout": ("Full Size", "TKL", "75%", "60%"), "connection": ("Wireless", "Wired", "Bluetooth")},
      ("typing", "gaming", "programming", "the office")),
    C("mouse", ("Mouse", "Wireless Mouse", "Gaming Mouse", "Ergonomic Mouse"),
      {"Logitech": ("MX Master 3S", "M185", "G502 X", "Lift", "G305"), "Razer": ("DeathAdder V3", "Basilisk V3", "Viper Mini"),
       "Apple": ("Magic Mouse",), "Microsoft": ("Bluetooth Mouse", "Arc Mouse"), "Corsair": ("Harpoon RGB",)},
      (10, 160), {"connection": ("Wireless", "Wired", "Bluetooth"), "color": ("Black", "White", "Graphite")},
      ("gaming", "productivity", "travel")),
    C("cookware", ("Cookware Set", "Nonstick Frying Pan", "Cast Iron Skillet", "Dutch Oven"),
      {"Lodge": ("Pre-Seasoned Skillet", "Enameled Dutch Oven"), "T-fal": ("Ultimate Hard Anodized", "Signature Nonstick"),
       "All-Clad": ("D3 Stainless", "HA1 Nonstick"), "Le Creuset": ("Signature Round Dutch Oven",),
       "Calphalon": ("Classic", "Premier"), "Caraway": ("Nonstick Ceramic",), "HexClad": ("Hybrid Pan",)},
      (20, 700), {"pieces": ("1 piece", "3 pieces", "10 pieces", "12 pieces"), "size": ("8 inch", "10 inch", "12 inch")},
      ("everyday cooking", "searing", "induction cooktops")),
    C("kitchen_knife", ("Chef Knife", "Knife Set", "Santoku Knife", "Knife Block Set"),
      {"Wusthof": ("Classic", "Gourmet"), "Zwilling": ("Pro", "Four Star"), "Victorinox": ("Fibrox Pro",),
       "Shun": ("Classic", "Premier"), "Global": ("G-2",), "Henckels": ("Solution", "Statement"),
       "Mercer": ("Millennia", "Genesis")},
      (20, 500), {"blade": ("8 inch", "7 inch", "6 inch"), "pieces": ("1 piece", "7 pieces", "15 pieces")},
      ("home cooks", "meal prep", "gifts")),
    C("tent", ("Camping Tent", "Backpacking Tent", "Family Tent", "Pop Up Tent"),
      {"Coleman": ("Sundome", "Skydome", "WeatherMaster"), "REI Co-op": ("Half Dome SL", "Trail Hut", "Base Camp"),
       "Big Agnes": ("Copper Spur HV UL", "Tiger Wall"), "MSR": ("Hubba Hubba", "Elixir"),
       "Kelty": ("Late Start", "Wireless"), "Marmot": ("Tungsten",)},
      (50, 700), {"capacity": ("1 person", "2 person", "4 person", "6 person"), "season": ("3-season", "4-season")},
      ("camping", "backpacking", "festivals", "family trips")),
    C("toy", ("Building Set", "Toy", "Board Game", "Puzzle"),
      {"LEGO": ("Classic Creative Brick Box", "Star Wars Millennium Falcon", "City Fire Station", "Technic Race Car"),
       "Hasbro": ("Monopoly", "Connect 4", "Play-Doh Kitchen"), "Mattel": ("Hot Wheels Track Set", "Barbie Dreamhouse", "UNO"),
       "Melissa & Doug": ("Wooden Puzzle", "Pretend Play Set"), "Ravensburger": ("1000 Piece Puzzle",),
       "Fisher-Price": ("Laugh & Learn", "Little People")},
      (8, 200), {"age": ("3+", "6+", "8+", "12+"), "pieces": ("100 pieces", "500 pieces", "1000 pieces")},
      ("kids", "family game night", "birthday gifts")),
    C("skincare", ("Moisturizer", "Face Serum", "Sunscreen", "Facial Cleanser"),
      {"CeraVe": ("Daily Moisturizing Lotion", "Hydrating Cleanser", "AM Facial Lotion SPF 30"),
       "La Roche-Posay": ("Toleriane Double Repair", "Anthelios SPF 60"), "Neutrogena": ("Hydro Boost", "Ultra Sheer SPF 70"),
       "The Ordinary": ("Niacinamide 10% + Zinc", "Hyaluronic Acid 2%"), "Olay": ("Regenerist", "Retinol 24"),
       "Cetaphil": ("Gentle Skin Cleanser", "Daily Facial Moisturizer")},
      (7, 80), {"size": ("1 fl oz", "3 fl oz", "8 fl oz", "16 fl oz"), "skin_type": ("dry skin", "oily skin", "sensitive skin")},
      ("dry skin", "sensitive skin", "daily use", "acne")),
    C("printer", ("Printer", "All-in-One Printer", "Laser Printer", "Inkjet Printer"),
      {"HP": ("DeskJet 4155e", "OfficeJet Pro 9015e", "LaserJet M209dw"), "Canon": ("PIXMA TR4720", "imageCLASS MF275dw"),
       "Epson": ("EcoTank ET-2800", "WorkForce WF-2950"), "Brother": ("HL-L2350DW", "MFC-J1010DW")},
      (60, 500), {"type": ("Color", "Monochrome"), "connection": ("Wireless", "USB")},
      ("home office", "students", "photos")),
    C("gaming_console", ("Gaming Console", "Video Game Console", "Handheld Console"),
      {"Sony": ("PlayStation 5 Slim", "PlayStation 5 Pro", "PlayStation Portal"), "Microsoft": ("Xbox Series X", "Xbox Series S"),
       "Nintendo": ("Switch OLED", "Switch Lite", "Switch"), "Valve": ("Steam Deck OLED",),
       "Meta": ("Quest 3", "Quest 3S")},
      (180, 750), {"storage": ("512GB", "1TB", "2TB", "64GB"), "edition": ("Standard", "Digital Edition", "Bundle")},
      ("gaming", "families", "travel")),
)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80]


def _price(rng: random.Random, cat: Category, brand: str, line: str) -> float:
    """Each product line has its own list price (log-uniform over the category's range, fixed
    by the line's name), each listing varies +-20% around it and ends in .99 / .95 / .00."""
    lo, hi = cat.price
    base = math.exp(random.Random(f"{cat.key}/{brand}/{line}").uniform(math.log(lo), math.log(hi)))
    p = base * rng.uniform(0.8, 1.2)
    whole = max(int(p), 1)
    return float(f"{whole}.{rng.choice(('99', '99', '95', '49', '00'))}")


def _make(rng: random.Random, idx: int, cat: Category) -> Product:
    brand = rng.choice(sorted(cat.brands))
    line = rng.choice(cat.brands[brand])
    noun = rng.choice(cat.nouns)
    attrs = {k: rng.choice(v) for k, v in cat.attrs.items()}
    pid = f"P{idx:06d}"
    # Title like a marketplace listing: "<Brand> <line> <gender> <size-inch> <noun>, <color>"
    parts = [brand, line]
    if "gender" in attrs:
        parts.append(attrs["gender"])
    if cat.key in ("tv", "monitor"):
        parts.append(f"{attrs['screen_size']} Inch")
    if cat.key == "tv":
        parts.append(attrs["resolution"])
    parts.append(noun)
    extras = [v for k, v in attrs.items() if k not in ("gender", "screen_size", "resolution")]
    title = " ".join(parts) + (", " + ", ".join(extras[:2]) if extras else "")
    use = rng.choice(cat.uses)
    price = _price(rng, cat, brand, line)
    rating = round(min(5.0, max(1.0, rng.gauss(4.3, 0.35))), 1)
    reviews = int(math.exp(rng.uniform(math.log(3), math.log(60_000))))
    desc = (f"{brand} {line} {noun.lower()} built for {use}. "
            + "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in attrs.items()) + ".")
    return Product(
        id=pid, title=title, brand=brand, category=cat.key, price=price, rating=rating,
        review_count=reviews, description=desc,
        url=f"{BASE_URL}/p/{pid}/{_slug(brand + ' ' + line + ' ' + noun)}",
        image_url=f"{IMAGE_URL}/{pid}.jpg", attributes=attrs,
    )


def generate_catalog(n: int = DEFAULT_SIZE, seed: int = DEFAULT_SEED) -> list[Product]:
    """``n`` products spread evenly over :data:`CATEGORIES`, reproducible from ``seed``."""
    rng = random.Random(seed)
    cats = CATEGORIES
    return [_make(rng, i, cats[i % len(cats)]) for i in range(n)]


# ------------------------------------------------------------------ user catalogs

class CatalogError(ValueError):
    """A row of a user catalog is invalid; names the file, row (1-based) and field."""

    def __init__(self, source: str, row: int, field_name: str, reason: str) -> None:
        super().__init__(f"{source}: row {row}: {field_name}: {reason}")
        self.source, self.row, self.field, self.reason = source, row, field_name, reason


REQUIRED = ("id", "title", "brand", "price", "url")
OPTIONAL_DEFAULTS: dict[str, Any] = {"category": "", "rating": 0.0, "review_count": 0,
                                     "description": "", "image_url": "", "attributes": {}}
KNOWN = set(REQUIRED) | set(OPTIONAL_DEFAULTS)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def validate_row(row: dict[str, Any], source: str, n: int) -> Product:
    """One row -> Product, or :class:`CatalogError` naming the first bad field."""
    def err(f: str, reason: str) -> CatalogError:
        return CatalogError(source, n, f, reason)

    unknown = sorted(set(row) - KNOWN)
    if unknown:
        raise err(unknown[0], f"unknown field; known fields: {sorted(KNOWN)}")
    for f in REQUIRED:
        if row.get(f) in (None, ""):
            raise err(f, "missing")
    out: dict[str, Any] = dict(OPTIONAL_DEFAULTS)
    for f in ("id", "title", "brand", "category", "description", "url", "image_url"):
        v = row.get(f, out.get(f))
        if not isinstance(v, str):
            raise err(f, f"must be a string, got {_short(v)}")
        out[f] = v.strip()
    if len(out["title"]) > 300:
        raise err("title", f"is {len(out['title'])} characters; at most 300")
    for f in ("url", "image_url"):
        if out[f] and not re.match(r"^https?://\S+$", out[f]):
            raise err(f, f"must be an http(s) URL, got {_short(out[f])}")
    for f, lo, hi in (("price", 0.0, 1e7), ("rating", 0.0, 5.0)):
        v = row.get(f, out.get(f))
        try:
            num = float(v) if not isinstance(v, bool) and v not in (None, "") else float("nan")
        except (TypeError, ValueError):
            raise err(f, f"must be a number, got {_short(v)}") from None
        if not math.isfinite(num) or not lo <= num <= hi:
            raise err(f, f"must be a number in [{lo:g}, {hi:g}], got {_short(v)}")
        out[f] = num
    rc = row.get("review_count", 0)
    try:
        rc_i = int(rc) if not isinstance(rc, bool) and str(rc).strip().lstrip("-").isdigit() else None
    except (TypeError, ValueError):
        rc_i = None
    if rc_i is None or rc_i < 0:
        raise err("review_count", f"must be a non-negative integer, got {_short(rc)}")
    out["review_count"] = rc_i
    attrs = row.get("attributes", {})
    if isinstance(attrs, str):
        try:
            attrs = json.loads(attrs) if attrs.strip() else {}
        except json.JSONDecodeError as exc:
            raise err("attributes", f"is not valid JSON ({exc.msg})") from None
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        raise err("attributes", "must be an object of name -> value")
    out["attributes"] = {k: str(v) for k, v in attrs.items()}
    return Product(**out)


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    suffix = path.suffix.lower()
    with path.open(encoding="utf-8", newline="") as f:
        if suffix == ".csv":
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                raise CatalogError(str(path), 1, "header", "empty CSV file")
            for i, row in enumerate(reader, start=2):  # row 1 is the header
                if None in row:
                    raise CatalogError(str(path), i, "row", "more values than header columns")
                yield i, {k: v for k, v in row.items() if v is not None}
        elif suffix in (".jsonl", ".ndjson", ".json"):
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CatalogError(str(path), i, "row", f"is not valid JSON ({exc.msg})") from None
                if not isinstance(obj, dict):
                    raise CatalogError(str(path), i, "row", "must be a JSON object")
                yield i, obj
        else:
            raise CatalogError(str(path), 0, "file", "must end in .jsonl, .ndjson or .csv")


def load_catalog(path: str | Path) -> list[Product]:
    """Load and validate a JSONL or CSV catalog; ids must be unique."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"catalog {p} not found")
    seen: set[str] = set()
    out = []
    for n, row in _rows(p):
        prod = validate_row(row, str(p), n)
        if prod.id in seen:
            raise CatalogError(str(p), n, "id", f"duplicate id {_short(prod.id)}")
        seen.add(prod.id)
        out.append(prod)
    if not out:
        raise CatalogError(str(p), 0, "file", "no products")
    return out


def write_jsonl(products: Iterable[Product], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for prod in products:
            f.write(json.dumps(prod.to_json(), separators=(",", ":")) + "\n")
