"""A person's own files as a corpus: readers of each format (`readers`) and a folder walked into documents
(`folder`)."""

from retriever.files.folder import FolderOptions, FolderReport, page_of, read_folder
from retriever.files.readers import READERS, FileText, Reader, UnreadableFile, reader_for

__all__ = ["READERS", "FileText", "FolderOptions", "FolderReport", "Reader", "UnreadableFile", "page_of",
           "read_folder", "reader_for"]
