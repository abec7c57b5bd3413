
mod recording;
