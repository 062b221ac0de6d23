// text_corpus.cpp — the built-in training text for the character-level GPT.
//
// Written for this project (no third-party text), plain ASCII, a few KB: long
// enough that a small model learns letter and word statistics within a few
// dozen steps, short enough to live in the binary.
#include <models/text_data.h>

namespace remat::models {

const std::string& builtin_text() {
  static const std::string text =
      "The lighthouse keeper wrote in his log every evening, whether or not "
      "anything had happened. Most days nothing had. The wind came from the "
      "west, the gulls argued on the rocks, and the lamp turned its slow "
      "circle over the water. He wrote the weather first, then the ships he "
      "had seen, then a line or two about the small things: a seal asleep on "
      "the landing, a new crack in the whitewash, the smell of rain before it "
      "arrived.\n\n"
      "In the spring a boy from the village began to bring the supplies. He "
      "rowed out twice a week with flour, oil, coffee and letters, and he "
      "always stayed longer than he needed to. He asked how the lens was "
      "cleaned, why the light flashed in threes, what the keeper did when the "
      "fog came down so thick that the beam stopped a few yards from the "
      "glass. The keeper answered slowly, the way he did everything, and the "
      "boy listened as if the answers were a map of some country he meant to "
      "visit.\n\n"
      "When the fog comes, the keeper said, you start the horn, and you keep "
      "it going until you can see the far buoy again. It may be an hour. It "
      "may be two days. You do not stop because you are tired, and you do not "
      "stop because you think no one is out there. You cannot know who is out "
      "there. That is the whole of the job: to keep doing the simple thing "
      "for people you will never meet.\n\n"
      "The boy thought about this on the long row home. He thought about it "
      "at supper, and in bed, and in the morning when his mother sent him to "
      "the market with a list. It seemed to him that most of the grown people "
      "he knew were doing something like that. The baker rose before dawn so "
      "that the bread would be warm for strangers. The woman at the post "
      "office sorted letters she would never read. The ferryman crossed the "
      "same stretch of river forty times a day and never once complained that "
      "the far bank was not somewhere new.\n\n"
      "Summer came, and with it the visitors, who climbed the hill to look at "
      "the tower and take pictures of the sea. Some of them asked to go up. "
      "The keeper let them, a few at a time, and showed them the great lens "
      "with its rings of glass, each ring bending the light a little more "
      "than the one inside it, until all of it left the tower in a single "
      "bright line. People were always surprised that the lamp itself was so "
      "small. It is not the flame, he told them. It is the glass around it. "
      "A small light, well gathered, can be seen for twenty miles.\n\n"
      "In the autumn the storms began. One night in October the wind rose so "
      "high that the tower hummed like a plucked string, and the spray came "
      "over the gallery rail, sixty feet above the rocks. The keeper did not "
      "sleep. He trimmed the wick, wound the clockwork that turned the lens, "
      "and wrote in the log every hour: wind north west, very strong; sea "
      "heavy; light burning well. Near dawn he saw a fishing boat far out, "
      "running for the harbour with half its sail torn away. He watched it "
      "until it passed the point and vanished behind the breakwater, and then "
      "he wrote that down too.\n\n"
      "The next week the boy brought a letter with the supplies. It was from "
      "the fisherman's wife. She did not know the keeper's name, so she had "
      "addressed it simply to the light. Thank you, it said, for being there. "
      "The keeper read it twice, folded it carefully, and put it inside the "
      "cover of the log, where it stayed for the rest of his years on the "
      "island.\n\n"
      "Years later, when the boy had grown and the light had been given a "
      "motor and a timer and no longer needed anyone to wind it, he came back "
      "to the island and found the old logs in a cupboard. He read them "
      "through the afternoon and into the evening: wind, weather, ships, "
      "seals, cracks in the paint, the smell of rain. Page after page of "
      "ordinary days, kept as carefully as the extraordinary ones. He "
      "understood then that the two had never really been different. The "
      "storm night was only an ordinary night on which the simple thing "
      "happened to matter, and no one could have said in advance which night "
      "that would be.\n";
  return text;
}

}  // namespace remat::models
